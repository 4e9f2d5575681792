"""``trawmem history``: what happened to a unit of a bank (``Memory.history``), oldest first; a
turn's ``added`` event with when it was said and when it was stored."""
from __future__ import annotations

import json


def _line(e: dict) -> str:
    """One event as a line: its time (``-``: before history was kept), kind, cause and the rest."""
    extra = [f"{k} {e[k]}" for k in ("by", "supersedes") if e.get(k)]
    if "event_time" in e or "stored_at" in e:
        extra += [f"said {e.get('event_time') or 'undated'}", f"stored {e.get('stored_at') or 'unknown'}"]
    return f"{e.get('time') or '-'}  {e['event']} ({e['cause']})" + (f": {', '.join(extra)}" if extra else "")


def cmd_history(a) -> int:
    from ..memory import Memory

    evs = Memory(a.collection, create=False).history(a.bank, a.unit)
    if a.json:
        print(json.dumps(evs, indent=1, ensure_ascii=False))
    else:
        for e in evs:
            print(_line(e))
    return 0


def configure(h) -> None:
    h.describe("Print what happened to a unit (a turn, a fact, a profile section) of a bank, oldest first: "
               "added, superseded, re-embedded, forgotten, reinstated, each with its time and cause, never its "
               "content; a turn the bank holds shows when it was said and when it was stored (stored_at: "
               "'unknown' for a turn stored before that was kept). docs/python-api.md, history.")
    h.add_argument("--collection", required=True, help="collection directory")
    h.add_argument("--bank", required=True, help="bank id")
    h.add_argument("--unit", required=True, help="unit id: a turn id, a fact id or a profile section id")
    h.add_argument("--json", action="store_true", help="print the events as JSON (Memory.history's dicts)")
    h.set_defaults(fn=cmd_history)
