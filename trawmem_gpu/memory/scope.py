"""A bank as a caller bound to a filter sees it (issue 42): the *bound view*.

A key of ``trawmem serve`` / ``trawmem mcp --http`` bound to a filter over turn metadata
(``trawmem serve-key --where``, ``serve.keys.Tenant.where``) shares its banks with other users;
everything it is answered must come from the turns that pass its filter. This module is the one
home of what that view is, for every door that answers such a key (the server's routes through
``SelectionService``, MCP's tools through ``Memory``):

* **counts and dates** (``GET /v1/banks``, ``GET /v1/banks/{id}``, an append's answer, MCP
  ``list_banks`` / ``add_turns``): ``n_units``, ``n_threads``, ``n_sessions``, ``first_date`` and
  ``last_date`` of the passing turns only (:func:`scoped_summary`);
* **history** (:func:`scoped_history`): a turn the bank holds that passes the filter, with its
  ``added`` and ``forgotten`` events only (a ``re-embedded`` event follows any write to its session,
  another user's too); any other unit (another user's turn, a fact, a profile section, a forgotten
  turn) answers as a unit the bank does not hold;
* **refusals of an append** (``memory.turns.screen`` with ``AppendBatch.scope``): an id the bank
  holds outside the filter is refused as an id held "with other content", the same words as
  for the key's own turn with other content, never whose, what or when (a turn dated before the bank's last
  turn is stored at its place in time, ``ingest.late``, never refused);
* **a chat message's assigned id** (``memory.turns.Assign``): ``msg-<n>`` numbers past the
  caller's own turns, not the bank's;
* **a forget's answer** (:func:`forget_within`): ``forgotten`` lists only ids it asked for
  that pass the filter; ``n_units`` counts the passing turns.

What stays visible by necessity: that a turn id is taken (a collision is refused, so nothing is
overwritten).
Give bound keys' turns ids that cannot collide (a user prefix, a UUID).
"""
from __future__ import annotations

from ..errors import InputError

HISTORY_EVENTS = ("added", "forgotten")
"""The events of a turn's history a bound caller is shown (see the module docstring)."""


def passes(where, turn) -> bool:
    """Whether ``turn`` passes the filter ``where`` (None: every turn does)."""
    return where is None or where.matches(getattr(turn, "metadata", None))


def scoped_summary(bank, where) -> dict:
    """``memory.answers.bank_summary``'s fields over the turns of ``bank`` that pass ``where``."""
    thread = bank.unit_thread
    idx = [i for i, t in enumerate(bank.turns) if passes(where, t)]
    turns = [bank.turns[i] for i in idx]
    times = [t.time for t in turns if t.time is not None]
    return {"bank_id": bank.bank_id, "n_units": len(turns), "n_threads": len({int(thread[i]) for i in idx}),
            "n_sessions": len({t.session for t in turns}),
            "first_date": min(times).isoformat() if times else None,
            "last_date": max(times).isoformat() if times else None}


def scoped_history(bank, evs: list[dict] | None, unit_id: str, where) -> list[dict] | None:
    """The events ``evs`` of ``unit_id`` (``memory.history.unit_history``) a caller bound to
    ``where`` may see: None unless ``bank`` holds a turn of that id that passes it."""
    turn = None if bank is None or evs is None else bank.turn_map().get(unit_id)
    if turn is None or not passes(where, turn):
        return None
    return [e for e in evs if e.get("event") in HISTORY_EVENTS]


def forget_within(registry, bank_id: str, turn_ids: list[str] | None, where, forget):
    """A forget (``memory.banks.ForgetResult``) by a key bound to the filter ``where`` (``serve.keys.Tenant.where``): ``forget`` of
    the ids whose turns pass it; the others are left alone and reported missing, as ids the bank
    does not hold (which they are, for this key). A whole bank (``turn_ids`` None) is refused."""
    if turn_ids is None:
        raise InputError("an API key bound to a filter forgets turns by id only, not a whole bank")
    bank = registry.get(bank_id)
    if bank is None:
        raise registry.absent(bank_id)
    mine = {t.turn_id for t in bank.turns if where.matches(getattr(t, "metadata", None))}
    asked = [t for t in turn_ids if t in mine]
    res = forget(asked)
    # only its own ids it asked for (the forget answers no others): the turns another process forgot
    # beside this one, read from disk by the rewrite and dropped from the engine all the same, are
    # not this key's to learn of
    res.forgotten = [t for t in res.forgotten if t in mine]
    res.missing = list(dict.fromkeys([*res.missing, *(t for t in turn_ids if t not in mine)]))
    return res
