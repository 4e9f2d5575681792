"""A real-text bank of any size: the LoCoMo dev conversations one after another, repeated under new
ids, as one long-lived agent's memory.

How it is made (nothing of it is written into the repository: the banks go to a temporary
directory and are removed after):

* the 7 dev conversations (4,003 turns) in file order, then again, and again, until ``n`` turns:
  three passes give the issue's 12,009-turn bank, 25 give 100,075;
* turn ``D3:7`` of conversation ``conv-26`` in pass ``p`` gets the id ``r{p}:conv-26:D3:7``;
  sessions are renumbered 1, 2, 3, ... across everything, so every conversation's sessions follow
  the previous one's;
* each conversation's parsed times are shifted so it starts 30 days after the previous one ends:
  times never go back, as an append requires; the ``timestamp`` text (what the encoder reads, in
  front of each turn) is left as the data gives it, so every pass embeds the same texts and the
  on-disk embedding cache encodes each text once, however many passes.

The appended turns of the write benchmarks are new text (``append_record``), after the bank's last turn.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path


def real_turns(n: int, path: Path) -> list:
    """The first ``n`` turns of the repeated dev conversations (see the module docstring)."""
    from trawmem_gpu.data import load_conversations

    convs = load_conversations(path)
    out, session, p, last = [], 0, 0, None
    while len(out) < n:
        for c in convs:
            first = next((t.time for t in c.turns if t.time is not None), None)
            shift = (last - first + timedelta(days=30)) if (last is not None and first is not None) else timedelta(0)
            prev = None
            for t in c.turns:
                if t.session != prev:
                    session, prev = session + 1, t.session
                tm = t.time + shift if t.time is not None else None
                out.append(replace(t, turn_id=f"r{p}:{c.bank_id}:{t.turn_id}", session=session, time=tm))
                last = tm or last
                if len(out) == n:
                    return out
        p += 1
    return out


def append_record(after, i: int) -> dict:
    """A new turn (as ``Memory.add`` takes it) one minute after the turn ``after``, in its session's
    day (so it continues that session, as a live agent's next message does)."""
    tm = after.time + timedelta(minutes=1 + i) if after.time is not None else None
    return {"turn_id": f"new-{i}", "speaker": after.speaker,
            "text": f"Quick note {i}: I booked the trail cabin for the weekend and packed the blue tent.",
            "timestamp": tm.isoformat() if tm else after.timestamp, "session": after.session}


def append_turn(after, i: int):
    """:func:`append_record` as a ``Turn`` (for ``ingest.update_bank``)."""
    from trawmem_gpu.data.types import Turn

    r = append_record(after, i)
    return Turn(r["turn_id"], r["speaker"], r["text"], r["session"], r["timestamp"],
                after.time + timedelta(minutes=1 + i) if after.time is not None else None)
