"""The arguments of ``Memory``'s calls, checked: each function returns the value a call uses, or
raises an ``InputError`` naming the argument (``queries[i]``, ``where[i]``, ``vectors``, ...), as
the server's wire models do for the same fields."""
from __future__ import annotations

from collections.abc import Iterable
from datetime import date as _date, datetime

from ..errors import InputError


def query_fields(fn: str, query: dict) -> dict:
    """The query fields a call names (``hops=None``: left out, the default), or the ``TypeError``
    Python gives an unknown keyword argument."""
    from ..select.params import FIELDS

    bad = next((k for k in query if k not in FIELDS), None)
    if bad is not None:
        raise TypeError(f"{fn}() got an unexpected keyword argument {bad!r}")
    return {k: v for k, v in query.items() if not (k == "hops" and v is None)}


def pairs(queries: list, registry) -> tuple[list[str], list[str]]:
    """The bank ids and the stripped questions of ``(bank_id, question)`` pairs, each checked (an
    ``InputError`` naming ``queries[i]``; ``UnknownBank`` / ``QuarantinedBank`` for a bank
    ``registry`` does not serve)."""
    from ..data.types import MAX_QUESTION_CHARS

    bids, qs = [], []
    for i, q in enumerate(queries):
        if isinstance(q, (str, bytes, dict)) or not isinstance(q, Iterable) or len(q := tuple(q)) != 2:
            raise InputError(f"queries[{i}]: expected a (bank_id, question) pair")
        b, text = q
        bank_arg(b, f"queries[{i}]")
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"queries[{i}]: the question is empty")
        if len(text) > MAX_QUESTION_CHARS:
            raise InputError(f"queries[{i}]: the question is {len(text)} characters; the limit is "
                             f"{MAX_QUESTION_CHARS}")
        if b not in registry:
            raise registry.absent(b, f"queries[{i}]: " if len(queries) > 1 else "")
        bids.append(b)
        qs.append(text.strip())
    return bids, qs


def bank_arg(bank_id, name: str = "bank_id") -> str:
    """``bank_id`` when it is a string; else an ``InputError`` naming the argument (the id rules
    themselves are the store's, checked where the bank is made or looked up)."""
    if not isinstance(bank_id, str):
        raise InputError(f"{name}: expected a bank id string, got {type(bank_id).__name__}")
    return bank_id


def turn_ids_arg(turn_ids) -> list[str] | None:
    """``turn_ids`` of :meth:`Memory.forget` as a list of strings (one string: a list of it;
    None: the whole bank); else an ``InputError`` naming the argument."""
    if turn_ids is None:
        return None
    if isinstance(turn_ids, str):
        return [turn_ids]
    if not isinstance(turn_ids, Iterable):
        raise InputError(f"turn_ids: expected a list of turn id strings, got {type(turn_ids).__name__}")
    turn_ids = list(turn_ids)
    bad = [t for t in turn_ids if not isinstance(t, str)]
    if bad:
        raise InputError(f"turn_ids: expected turn id strings, got {type(bad[0]).__name__}")
    return turn_ids


def date_of(d, where: str) -> datetime | None:
    if d is None:
        return d
    if isinstance(d, datetime):
        from ..data.dates import naive_utc

        try:
            return naive_utc(d)  # as every door reads dates: an aware one in UTC
        except ValueError as e:
            raise InputError(f"{where}: {e}") from None
    if isinstance(d, _date):
        return datetime(d.year, d.month, d.day)
    if isinstance(d, str):
        from ..data.dates import parse_date

        try:
            return parse_date(d)
        except ValueError as e:
            raise InputError(f"{where}: {e}") from None
    raise InputError(f"{where}: expected a date, a datetime or a date string, got {type(d).__name__}")


def filters(where, n: int) -> list | None:
    """``where`` (one filter for all queries, or a list of one per query) parsed
    (``data.filters.parse_filter``: an ``InputError`` names ``where`` or ``where[i]`` and the path
    inside), or None when no query has one."""
    from ..data.filters import parse_filter

    if where is None:
        return None
    if isinstance(where, (list, tuple)):
        if len(where) != n:
            raise InputError(f"where: {len(where)} filters for {n} queries (give one for all, or one per query)")
        flts = [parse_filter(w, f"where[{i}]") for i, w in enumerate(where)]
    else:
        flts = [parse_filter(where)] * n
    return None if all(f is None for f in flts) else flts


def vectors_arg(vectors, n: int, dim: int):
    """``vectors`` as an ``(n, dim)`` float32 array: one finite vector per query, never reshaped."""
    import numpy as np

    try:
        Z = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError):  # not numbers, or vectors of different lengths
        Z = None
    if Z is None or Z.shape != (n, dim) or not np.isfinite(Z).all():
        got = "" if Z is None or Z.ndim != 2 else f", got {Z.shape[0]} of {Z.shape[1]}"
        raise InputError(f"vectors: expected {n} finite vectors of {dim} numbers (one per query){got}")
    return Z
