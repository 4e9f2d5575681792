"""The LLM layers of a build: ``--facts llm`` (``trimem.extract``) and ``--profiles llm``
(``trimem.profiles``), attached to a bank with their vectors.

:func:`attach_llm_layers` takes a bank (and, on ``build --update``, the layers the bank had
before and the index of its first new turn), extracts facts for the new turns only, remakes the
profiles the new facts touch, encodes what is new (a fact as ``facts.view.fact_embed_text``, a
section as ``profile_embed_text``; unchanged sections keep their vectors) and returns the bank
with its layers and the run's counts in ``stats`` (``facts_llm``, ``profiles_llm``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from ..facts.schema import Fact, ProfileSection
from ..facts.view import fact_embed_text, profile_embed_text
from ..store.bank import Bank
from .extract import OVERLAP, WINDOW, extract_facts
from .profiles import build_profiles
from .prompts import PromptSet


def _encode(encoder, texts: list[str], dim: int) -> np.ndarray:
    return encoder.encode(texts).astype(np.float32) if texts else np.zeros((0, dim), np.float32)


def attach_llm_layers(bank: Bank, llm, encoder, *, facts: bool = True, profiles: bool = False,
                      prompts: PromptSet | None = None, new_from: int = 0, old_facts: Sequence[Fact] = (),
                      old_fact_vecs: np.ndarray | None = None, old_profiles: Sequence[ProfileSection] = (),
                      old_profile_vecs: np.ndarray | None = None, window: int = WINDOW,
                      overlap: int = OVERLAP) -> Bank:
    """``bank`` with LLM facts and / or profiles (module docstring). ``new_from`` 0 with no old
    layers: a fresh build. ``facts=False`` keeps ``old_facts`` (or the bank's own) as the facts the
    profiles are made from."""
    ps = prompts or PromptSet()
    dim = bank.unit_vecs.shape[1]
    stats = dict(bank.stats)
    base_facts = list(old_facts) if (old_facts or new_from) else list(bank.facts)
    base_vecs = old_fact_vecs if (old_facts or new_from) else bank.fact_vecs
    if base_vecs is None:
        base_vecs = np.zeros((0, dim), np.float32)
    new: list[Fact] = []
    if facts:
        new, st = extract_facts(bank.turns, llm, ps, window=window, overlap=overlap, new_from=new_from,
                                existing=base_facts)
        stats["facts_llm"] = st.to_dict()
        ts = {t.turn_id: t.timestamp for t in bank.turns}
        new_vecs = _encode(encoder, [fact_embed_text(f, ts[f.source_turns[0]]) for f in new], dim)
        all_facts, fact_vecs = base_facts + new, np.concatenate([base_vecs, new_vecs])
    else:
        all_facts, fact_vecs = base_facts, base_vecs
    out = replace(bank, facts=tuple(all_facts), fact_vecs=fact_vecs if all_facts else None, stats=stats)
    if not profiles:
        if old_profiles:
            out = replace(out, profiles=tuple(old_profiles), profile_vecs=old_profile_vecs)
        return out
    update = bool(old_profiles) and (new_from > 0 or bool(old_facts))
    secs, pst = build_profiles(all_facts, llm, ps, existing=old_profiles if update else (),
                               new_fact_ids=[f.fact_id for f in new] if update else None)
    stats["profiles_llm"] = pst.to_dict()
    old_vec = {id(s): old_profile_vecs[i] for i, s in enumerate(old_profiles)} if old_profile_vecs is not None else {}
    todo = [s for s in secs if id(s) not in old_vec]
    fresh = dict(zip(map(id, todo), _encode(encoder, [profile_embed_text(s) for s in todo], dim)))
    pv = np.stack([old_vec.get(id(s), fresh.get(id(s))) for s in secs]).astype(np.float32) if secs else None
    return replace(out, profiles=tuple(secs), profile_vecs=pv, stats=stats)
