"""Facts from LoCoMo's per-session ``observation`` field (``--facts locomo``), no LLM needed.

Each sample's ``observation`` maps ``session_N_observation`` to ``{person: [[text, dia_id], ...]}``:
LLM-extracted facts, each citing the turn(s) it came from. Their ids are read as the loader reads
question evidence (:func:`trawmem_gpu.data.evidence.parse_evidence`: ``"D3:7"``, a list of ids,
several ids in one string, stray colons), and every repair is counted; an entry whose ids name no
turn of the conversation is dropped and counted (``dropped_facts``). A fact's date is its
session's date (ISO), its persons the person it is filed under, its id ``F:<session>:<n>``.
An observation for a session the conversation does not have (``session_42_observation`` of a
conversation of 19 sessions) is an ``InputError`` naming the key: its facts would be filed under a
session that is not there, and dated by none.

:func:`observation_conflict` tells an ``--update`` whether the observations of the stored turns
changed since the bank's facts were read from them.
"""
from __future__ import annotations

import re
from pathlib import Path

from ...data.dates import parse_date
from ...data.evidence import parse_evidence
from ...data.locomo import locomo_samples
from ...data.types import EvidenceRepairs
from ...errors import InputError
from ...store.facts import Fact, fact_id

_OBS = re.compile(r"^session_(\d+)_observation$")
_SESSION = re.compile(r"^session_(\d+)(?:_date_time)?$")


def _sessions_text(ns: list[int]) -> str:
    if not ns:
        return "no session"
    if ns == list(range(ns[0], ns[-1] + 1)) and len(ns) > 2:
        return f"sessions {ns[0]}-{ns[-1]}"
    return ("session " if len(ns) == 1 else "sessions ") + ", ".join(map(str, ns))


def facts_from_sample(sample: dict, known_ids: set[str], where: str = "", *, dayfirst: bool = False
                      ) -> tuple[list[Fact], dict]:
    """One LoCoMo sample's facts and the counts of what was repaired or dropped."""
    obs = sample.get("observation")
    repairs = EvidenceRepairs()
    stats = {"facts": 0, "dropped_facts": 0}
    if obs is None:
        return [], {**stats, **repairs.as_dict()}
    if not isinstance(obs, dict):
        raise InputError(f"{where}: field 'observation' must be an object")
    conv = sample.get("conversation") or {}
    sessions = {int(s.group(1)) for k in conv if (s := _SESSION.match(k))}  # session_N, session_N_date_time
    facts: list[Fact] = []
    for key in sorted(obs, key=lambda k: int(m.group(1)) if (m := _OBS.match(k)) else -1):
        m = _OBS.match(key)
        if not m:
            raise InputError(f"{where}: field 'observation.{key}' is not named session_N_observation")
        n = int(m.group(1))
        if n not in sessions:
            raise InputError(f"{where}: field 'observation.{key}' is for session {n}, which the conversation "
                             f"does not have (it has {_sessions_text(sorted(sessions))}); a fact must come from a "
                             f"session of the conversation")
        per = obs[key]
        if not isinstance(per, dict):
            raise InputError(f"{where}: field 'observation.{key}' must be an object of person -> facts")
        date = conv.get(f"session_{n}_date_time")
        iso = None
        if isinstance(date, str):
            try:
                iso = parse_date(date, dayfirst=dayfirst).date().isoformat()
            except ValueError:
                iso = None
        k = 0
        for person, items in per.items():
            if not isinstance(items, list):
                raise InputError(f"{where}: field 'observation.{key}.{person}' must be a list of [text, dia_id]")
            for i, it in enumerate(items):
                if not (isinstance(it, (list, tuple)) and len(it) == 2 and isinstance(it[0], str)):
                    raise InputError(f"{where}: field 'observation.{key}.{person}[{i}]' must be [text, dia_id]")
                text = it[0].strip()
                src = parse_evidence(it[1], known_ids, repairs)
                if not text or not src:
                    stats["dropped_facts"] += 1
                    continue
                k += 1
                try:  # the fact schema (``store.facts``): a 10 MB observation is refused, naming it
                    facts.append(Fact(fact_id(n, k), text, src, persons=(person,), date=iso, session=str(n)))
                except ValueError as e:
                    raise InputError(f"{where}: field 'observation.{key}.{str(person)[:64]}[{i}]': {e}") from None
    stats["facts"] = len(facts)
    return facts, {**stats, **repairs.as_dict()}


def load_locomo_facts(path: str | Path, turn_ids: dict[str, set[str]], *, dayfirst: bool = False
                      ) -> tuple[dict[str, list[Fact]], dict]:
    """Facts of every sample of a LoCoMo file whose id is in ``turn_ids`` (sample id -> its bank's
    turn ids), and the summed counts."""
    path = Path(path)
    data = locomo_samples(path)
    out: dict[str, list[Fact]] = {}
    total: dict[str, int] = {}
    for i, s in enumerate(data):
        sid = s.get("sample_id") if isinstance(s, dict) else None
        if sid not in turn_ids:
            continue
        facts, st = facts_from_sample(s, turn_ids[sid], f"{path}: sample {i} (sample {sid!r})", dayfirst=dayfirst)
        out[sid] = facts
        for k, v in st.items():
            total[k] = total.get(k, 0) + v
    return out, total


def _by_statement(facts) -> dict[tuple, set[str]]:
    """(session, persons, sentence) -> the turns cited, over ``facts`` (a sentence stated twice,
    once per build, counts once with the union of its turns)."""
    out: dict[tuple, set[str]] = {}
    for f in facts:
        out.setdefault((f.session, f.persons, f.text), set()).update(f.source_turns)
    return out


def observation_conflict(stored, given) -> str | None:
    """Why the facts ``given`` (the input's observations of a bank's stored turns) are not the facts
    ``stored`` in the bank (a phrase naming the first difference), or None when they are the same."""
    have, want = _by_statement(stored), _by_statement(given)
    for key in sorted(set(have) | set(want), key=lambda k: (int(k[0]) if str(k[0]).isdigit() else -1, str(k))):
        session, persons, text = key
        where = f"observation session_{session}_observation.{'/'.join(persons) or '?'}: {text[:80]!r}"
        if key not in have:
            return f"{where} is in the input, not in the bank"
        if key not in want:
            return f"{where} is in the bank, no longer in the input"
        if have[key] != want[key]:
            return f"{where} cites {sorted(want[key])} in the input, {sorted(have[key])} in the bank"
    return None
