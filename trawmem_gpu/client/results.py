"""The client's results: dataclasses, field for field the server's response models
(``serve/models.py``, the wire models; a test holds the two together:
tests/client/test_client_wire_models.py); keys a newer server adds are ignored. They are
dataclasses, not those pydantic models, because the client installs without the serve extra
(httpx only), which is where pydantic comes from.

Every answer is checked against its dataclass's field types before it is built (:func:`parse`):
an answer of the wrong shape (not an object, a required field missing, a field of another type)
raises :class:`Malformed`, which the client turns into a :class:`~.errors.ServerError` with the
answer's status; a wrong shape never surfaces as an ``AttributeError`` or ``TypeError``, nor is
it passed on silently."""
from __future__ import annotations

import functools
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass


class Malformed(ValueError):
    """An answer that is not of its result's shape; the message names the field (``units[0].session``)."""


def _kind(v) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r[:40] + '...' if len(r) > 40 else r}"


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _has_default(f) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _value(tp, v, where: str):
    """``v`` as type ``tp`` (the field types the results use), or :class:`Malformed`."""
    if tp is typing.Any:  # a JSON value as the server sent it (a turn's metadata, a filter)
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, v, where)
    if origin is tuple:
        if not isinstance(v, list):
            raise Malformed(f"{where}: expected a list, got {_kind(v)}")
        return tuple(_value(args[0], x, f"{where}[{i}]") for i, x in enumerate(v))
    if origin is dict:
        if not isinstance(v, dict):
            raise Malformed(f"{where}: expected an object, got {_kind(v)}")
        return {k: _value(args[1], x, f"{where}.{k}") for k, x in v.items()}
    if is_dataclass(tp):
        return parse(tp, v, where)
    ok = {str: lambda: isinstance(v, str), bool: lambda: isinstance(v, bool),
          int: lambda: isinstance(v, int) and not isinstance(v, bool),
          float: lambda: isinstance(v, (int, float)) and not isinstance(v, bool)}[tp]()
    if not ok:
        raise Malformed(f"{where}: expected {tp.__name__}, got {_kind(v)}")
    if tp is float and not isinstance(v, float):
        try:
            return float(v)
        except OverflowError:
            raise Malformed(f"{where}: {_kind(v)} is out of a float's range") from None
    return v


def parse(cls, d, where: str = "answer"):
    """``cls`` from the keys of ``d`` it declares, each checked against its field's type (keys
    ``cls`` does not declare are ignored: a newer server may add some). A field with a default
    may be missing or null; any other field must be there, of its type."""
    if not isinstance(d, dict):
        raise Malformed(f"{where}: expected an object, got {_kind(d)}")
    kw = {}
    for f in fields(cls):
        tp = _hints(cls)[f.name]
        if f.name not in d or (d[f.name] is None and _has_default(f)):
            if not _has_default(f):
                raise Malformed(f"{where}.{f.name}: missing")
            continue
        kw[f.name] = _value(tp, d[f.name], f"{where}.{f.name}")
    return cls(**kw)


@dataclass(frozen=True)
class Unit:
    """One selected turn."""

    id: str
    speaker: str
    date: str | None
    timestamp: str
    text: str
    caption: str | None
    thread: int
    session: int
    metadata: dict[str, typing.Any] | None = None
    """The turn's metadata (None: none, or a server before metadata)."""
    members: tuple[str, ...] = ()
    """The ids of the messages the unit shows (a burst: all of them; empty from an older server)."""


@dataclass(frozen=True)
class ThreadHead:
    thread: int
    head: str | None


@dataclass(frozen=True)
class Timings:
    """Where a request's time went inside the server (milliseconds)."""

    queue_ms: float | None
    encode_ms: float
    select_ms: float
    assemble_ms: float
    batch_size: int
    total_ms: float | None = None


@dataclass(frozen=True)
class SelectResult:
    """The workspace for one question (``POST /v1/select``)."""

    bank_id: str
    bank_n_units: int
    question: str
    budget: int | None
    hops: int
    token_budget: int | None
    date: str | None
    date_used: bool
    units: tuple[Unit, ...]
    threads: tuple[ThreadHead, ...]
    text: str
    n_tokens: int
    tokenizer: str
    timings: Timings | None = None
    as_of: str | None = None
    """The date whose facts it shows (None: the current ones)."""
    where: dict[str, typing.Any] | None = None
    """The filter the server applied (the request's and the key's, and-ed); None: none."""

    @property
    def tokens(self) -> int:
        """``n_tokens``: the rendered workspace's tokens (as ``Memory``'s ``Workspace.tokens``)."""
        return self.n_tokens

    @property
    def unit_ids(self) -> list[str]:
        """The ids of the messages shown (a burst: all its members), in order."""
        return [m for u in self.units for m in (u.members or (u.id,))]

    @classmethod
    def from_json(cls, d) -> "SelectResult":
        return parse(cls, d)


@dataclass(frozen=True)
class BankSummary:
    bank_id: str
    n_units: int
    n_threads: int
    quarantined: str | None = None
    """Why the bank is not served (its files could not be loaded); None: it is served."""


@dataclass(frozen=True)
class BankList:
    """``GET /v1/banks``: the banks this key can see, and the collection's encoder."""

    banks: tuple[BankSummary, ...]
    encoder: str | None
    dim: int

    @classmethod
    def from_json(cls, d) -> "BankList":
        return parse(cls, d)


@dataclass(frozen=True)
class BankInfo:
    """``GET /v1/banks/{bank_id}``."""

    bank_id: str
    n_units: int
    n_threads: int
    n_sessions: int
    first_date: str | None
    last_date: str | None


@dataclass(frozen=True)
class AppendItem:
    """What an append did with one item of its request."""

    index: int
    status: str
    """stored, already_stored, refused or skipped."""
    turn_id: str | None = None
    field: str | None = None
    """Refused or skipped: the field at fault (``turns[3].timestamp``)."""
    reason: str | None = None


@dataclass(frozen=True)
class AppendResult(BankInfo):
    """``POST /v1/banks/{bank_id}/turns``: the bank after the append (its :class:`BankInfo`), and
    what the append did, per item (``items``; ``refused``: those refused, with field and reason)."""

    created: bool
    appended: int
    timings: dict[str, float] = field(default_factory=dict)
    stored: tuple[str, ...] = ()
    already_stored: tuple[str, ...] = ()
    items: tuple[AppendItem, ...] = ()
    refused: tuple[AppendItem, ...] = ()


@dataclass(frozen=True)
class HistoryEvent:
    """One event of a unit's history (``GET /v1/banks/{bank_id}/units/{unit_id}/history``)."""

    event: str
    """added, superseded, re-embedded, forgotten or reinstated."""
    time: str | None
    cause: str
    by: str | None = None
    supersedes: str | None = None
    event_time: str | None = None
    """``added`` of a turn the bank holds: when it was said (ISO 8601 UTC; None: undated)."""
    stored_at: str | None = None
    """``added`` of a turn the bank holds: when the bank stored it (None: before this was kept)."""


@dataclass(frozen=True)
class History:
    """A unit's events, oldest first (no content: ``Memory.history``)."""

    bank_id: str
    unit_id: str
    events: tuple[HistoryEvent, ...]


@dataclass(frozen=True)
class ForgetResult:
    """A forget's answer (``DELETE /v1/banks/{bank_id}`` or ``POST /v1/banks/{bank_id}/forget``,
    as ``Memory.forget`` returns it): the turn ids ``forgotten``, those the bank did not hold
    (``missing``), whether the whole bank is gone (``deleted``), the bank's ``n_units`` after it,
    and how many cache rows and ``score`` output records were erased."""

    bank_id: str
    forgotten: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    deleted: bool = False
    n_units: int = 0
    cache_rows: int = 0
    output_records: int = 0

    @classmethod
    def from_json(cls, d) -> "ForgetResult":
        return parse(cls, d)


@dataclass(frozen=True)
class ImportRefused:
    """A turn an import did not bring in, and why (forgotten by the collection, or outside the key's filter)."""

    id: str
    reason: str


@dataclass(frozen=True)
class ImportResult:
    """An import's answer (``POST /v1/banks/{bank_id}/import``, as ``Memory.import_`` answers per
    bank): turns ``stored`` and ``already_stored`` (counts), those ``refused``, facts and profile
    sections added."""

    bank_id: str
    stored: int
    already_stored: int
    refused: tuple[ImportRefused, ...]
    facts: int
    profiles: int = 0
    """Profile sections added (0 from a server that exports none)."""
