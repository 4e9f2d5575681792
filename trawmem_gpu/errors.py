"""Errors the package raises on bad input: one message that names where and what."""
from __future__ import annotations

from typing import Iterable


class TrawmemError(Exception):
    """Base class of every error this package raises on purpose."""


class InputError(TrawmemError, ValueError):
    """Malformed input data; the message names the file, line or sample, and the field."""


class BankError(TrawmemError):
    """A bank directory is missing, corrupt, truncated, stale or of another format version."""


class QuarantinedBank(BankError):
    """A bank the collection holds but cannot serve: its files could not be loaded, or not
    prepared for the engine (``cause`` says why). The collection opens and serves its other
    banks; selecting from this one, adding to it or forgetting some of its turns raises this
    (HTTP 409), and forgetting the whole bank removes it (``trawmem forget --bank``,
    ``Memory.forget(bank_id)``, ``DELETE /v1/banks/{bank_id}``).

    :param where: a prefix locating the request (``"queries[3]: "``)
    """

    def __init__(self, bank_id: str, cause: str, where: str = ""):
        super().__init__(f"{where}bank {bank_id!r} is quarantined: {cause}; it is not served until it is removed "
                         f"(forget the whole bank: `trawmem forget --bank`, Memory.forget(bank_id) or DELETE "
                         f"/v1/banks/{{bank_id}}) and rebuilt")
        self.bank_id, self.cause, self.where = bank_id, cause, where

    def __reduce__(self):  # pickles (the front processes) with its fields
        return type(self), (self.bank_id, self.cause, self.where)


class UnknownBank(TrawmemError, KeyError):
    """A bank id that the collection, engine or server does not hold. A ``KeyError`` too, so
    ``except KeyError`` keeps working; ``str()`` is the plain message (no added quotes).

    :param where: a prefix locating the request (``"requests[3]: "``)
    :param detail: what the holder does hold, for a local caller (never sent to an HTTP client:
        the server answers ``where`` and ``bank_id`` only, as for a bank the key does not own)
    """

    def __init__(self, bank_id: str, where: str = "", detail: str = ""):
        super().__init__(f"{where}unknown bank id {bank_id!r}{detail}")
        self.bank_id, self.where, self.detail = bank_id, where, detail

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):  # pickles (Ray, the front processes) with its fields
        return type(self), (self.bank_id, self.where, self.detail)


class UnknownUnit(TrawmemError, KeyError):
    """A unit id (turn, fact, profile section) that a bank neither holds nor has a history of."""

    def __init__(self, bank_id: str, unit_id: str):
        super().__init__(f"bank {bank_id!r} holds no unit {unit_id!r} and has no history of one")
        self.bank_id, self.unit_id = bank_id, unit_id

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return type(self), (self.bank_id, self.unit_id)


class DuplicateTurns(InputError):
    """Turn ids that the bank already holds (nothing appended; HTTP 409)."""


class ConfigError(TrawmemError, ValueError):
    """An invalid configuration value."""


class Closed(TrawmemError, RuntimeError):
    """A call on a handle that was closed (an ``AsyncMemory`` after ``aclose()``)."""


class NoLLMConfigured(TrawmemError, RuntimeError):
    """An LLM-backed path was asked for but no LLM backend is configured."""


class LLMFallbackError(TrawmemError, RuntimeError):
    """``--strict-llm``: an LLM output was malformed, refused or failed, and the run would have
    fallen back (extractive head, embedding segmentation, no fact, the question alone)."""


def name_list(names: Iterable[str], limit: int = 5) -> str:
    """``'a', 'b', 'c', ... (7 more)``: the first ``limit`` names (repr), and how many were left out."""
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:limit])
    if len(names) > limit:
        shown += f", ... ({len(names) - limit} more)"
    return shown or "none"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 bank``, ``2 banks``, ``0 banks``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def read_json_object(path, label: str, malformed: str, error: type[Exception] = InputError) -> dict:
    """:func:`read_json` for a document that must be a JSON object (a sidecar, a config):
    anything else raises ``error("{label}: {malformed} (a JSON list, not an object)")``."""
    doc = read_json(path, label, malformed, error)
    if not isinstance(doc, dict):
        raise error(f"{label}: {malformed} (a JSON {type(doc).__name__}, not an object)")
    return doc


class JSONTooDeep(ValueError):
    """JSON nested past the interpreter's recursion limit (:func:`loads_json`); a ``ValueError``,
    as ``json.JSONDecodeError`` is, so every reader that refuses malformed JSON refuses it too."""


def loads_json(text: str | bytes, **kw):
    """``json.loads(text, **kw)``, the one JSON parse of the files and arguments the package reads: a
    document nested too deeply for the parser (``[[[[...``, where ``json`` raises
    ``RecursionError``) raises :class:`JSONTooDeep`, a ``ValueError`` as malformed JSON's
    ``json.JSONDecodeError`` is; a reader catches ``ValueError`` for both."""
    import json

    try:
        return json.loads(text, **kw)
    except RecursionError:
        raise JSONTooDeep("JSON nested too deeply (past the interpreter's recursion limit)") from None


def read_json(path, label: str, malformed: str, error: type[Exception] = InputError):
    """The JSON document in the file ``path``. A missing file raises ``error("{label}: file not
    found")``; an unreadable, non-UTF-8, malformed or too deeply nested one
    ``error("{label}: {malformed} (why)")``."""
    from pathlib import Path

    try:
        return loads_json(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{label}: file not found") from None
    except (OSError, ValueError) as e:  # UnicodeDecodeError, JSONDecodeError, JSONTooDeep
        raise error(f"{label}: {malformed} ({e})") from None
