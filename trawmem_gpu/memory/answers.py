"""What an append, a bank and the bank list answer: the fields every front (``Memory``, the
server's routes, MCP) gives back about banks, from a loaded bank or from its ``meta.json``.

A caller bound to a filter (``where``: ``memory.scope``) gets the counts of the turns that pass it."""
from __future__ import annotations

from .banks import AppendResult, BankRegistry
from .quarantine import cause_of


def bank_summary(bank, where=None) -> dict:
    """A bank's counts and date range (``Memory.banks``, ``GET /v1/banks/{id}``); ``where``: a
    caller bound to that filter (``memory.scope``) gets those of the turns that pass it."""
    if where is not None:
        from .scope import scoped_summary

        return scoped_summary(bank, where)
    times = [t.time for t in bank.turns if t.time is not None]  # naive UTC (store.files reads them so)
    return {"bank_id": bank.bank_id, "n_units": bank.n_units, "n_threads": bank.n_threads,
            "n_sessions": len({t.session for t in bank.turns}),
            "first_date": min(times).isoformat() if times else None,
            "last_date": max(times).isoformat() if times else None}


def append_answer(bank_id: str, res: AppendResult, where=None) -> dict:
    """The answer of an append (``Memory.add``, ``POST /v1/banks/{id}/turns``, MCP ``add_turns``):
    the bank's counts (zeros when every item of a first append was refused and no bank was made;
    ``where``: those of the turns passing a bound caller's filter), ``created``, ``appended``, the
    ``stored`` and ``already_stored`` ids, every item's outcome (``items``) and the ``refused`` ones."""
    summary = bank_summary(res.bank, where) if res.bank is not None else {
        "bank_id": bank_id, "n_units": 0, "n_threads": 0, "n_sessions": 0, "first_date": None, "last_date": None}
    items = [x.to_dict() for x in res.items]
    return {**summary, "created": res.created, "appended": res.appended, "stored": res.stored,
            "already_stored": res.already_stored, "items": items,
            "refused": [x for x in items if x["status"] == "refused"]}


def stored_summary(registry: BankRegistry, bank_id: str) -> dict:
    """:func:`bank_summary` of a bank that is not in memory, from its ``meta.json`` (its ``summary``;
    a bank written before it has none: its dates and sessions are then None)."""
    from ..store.files import read_meta

    m = read_meta(registry.coll.bank_path(bank_id))
    s = m.get("summary") or {}
    return {"bank_id": bank_id, "n_units": m.get("n_units"), "n_threads": m.get("n_threads"),
            "n_sessions": s.get("n_sessions"), "first_date": s.get("first_date"), "last_date": s.get("last_date")}


def summaries(registry: BankRegistry, where=None) -> list[dict]:
    """Every served bank's summary (loaded: :func:`bank_summary`; else :func:`stored_summary`;
    ``where``: a bound caller's, of the turns passing it, each bank opened) and every quarantined
    bank's row, by bank id."""
    loaded = registry.banks()
    rows = []
    for b in registry.ids():
        try:
            if where is not None:
                bank = registry.get(b)
                if bank is not None:
                    rows.append(bank_summary(bank, where))
                continue
            rows.append(bank_summary(loaded[b]) if b in loaded else stored_summary(registry, b))
        except Exception as e:  # noqa: BLE001 - a bank whose metadata no longer reads: quarantined
            registry.quarantine(b, cause_of(e, registry.coll.path))
    rows += [quarantined_summary(b, cause) for b, cause in dict(registry.quarantined).items()]
    return sorted(rows, key=lambda r: r["bank_id"])


def bank_rows(registry: BankRegistry) -> list[dict]:
    """``GET /v1/banks``: every served bank's counts (from its metadata when it is not in memory)
    and every quarantined bank's, with 0 and ``quarantined``: the cause."""
    rows = []
    for r in summaries(registry):
        q = r.get("quarantined")
        rows.append({"bank_id": r["bank_id"], "n_units": r["n_units"] or 0, "n_threads": r["n_threads"] or 0,
                     **({"quarantined": q} if q else {})})
    return rows


def quarantined_summary(bank_id: str, cause: str) -> dict:
    """A quarantined bank's row beside :func:`bank_summary`'s (``Memory.banks``)."""
    return {"bank_id": bank_id, "n_units": None, "n_threads": None, "n_sessions": None, "first_date": None,
            "last_date": None, "quarantined": cause}
