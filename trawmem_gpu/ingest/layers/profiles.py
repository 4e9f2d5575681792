"""``build --profiles llm``: TriMem's profiles of a bank, attached with their vectors.

The facts come first (``ingest.layers.facts.attach_facts``: ``--facts locomo`` or ``--facts llm``, the
latter TriMem's extraction). :func:`attach_profiles` then makes every person's profile from the
bank's facts (``ingest.layers.trimem_profiles``), or, on ``build --update`` (``new_fact_ids``: the facts the
update added), remakes only the sections those facts touch. New or changed sections are encoded
(``store.view.profile_embed_text``); unchanged ones keep their vectors. The run's counts go to
the bank's ``stats["profiles_llm"]``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional

import numpy as np

from ...errors import ConfigError
from ...store.view import profile_embed_text
from ...store.bank import Bank
from .trimem_profiles import ProfileStats, build_profiles
from .prompts import PromptSet


def profiles_summary(stats: list[ProfileStats]) -> str:
    """One line on what a build's profile runs did."""
    tot = {k: sum(getattr(s, k) for s in stats) for k in ("persons", "created", "updated", "unchanged",
                                                           "sections_changed", "retried", "halved", "failed",
                                                           "lines_refused")}
    return "profiles: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in tot.items())


def attach_profiles(bank: Bank, llm, encoder, *, prompts: PromptSet | None = None,
                    new_fact_ids: Optional[Iterable[str]] = None) -> tuple[Bank, ProfileStats]:
    """``bank`` with its profiles layer made (``new_fact_ids`` None) or updated (module docstring)."""
    if llm is None:
        raise ConfigError("profiles: 'llm' needs an LLM (`llm`)")
    if not bank.facts:  # nothing to build from (a bank whose extraction gave no fact)
        return bank, ProfileStats()
    if encoder.id != bank.encoder_id:
        raise ConfigError(f"profiles: bank {bank.bank_id!r} was encoded with {bank.encoder_id!r}, not {encoder.id!r}")
    update = new_fact_ids is not None and bool(bank.profiles)
    secs, st = build_profiles(bank.facts, llm, prompts, existing=bank.profiles if update else (),
                              new_fact_ids=new_fact_ids if update else None)
    old = {id(s): bank.profile_vecs[i] for i, s in enumerate(bank.profiles)} if update else {}
    todo = [s for s in secs if id(s) not in old]
    if todo:
        fresh = dict(zip(map(id, todo), encoder.encode([profile_embed_text(s) for s in todo]).astype(np.float32)))
    else:
        fresh = {}
    vecs = np.stack([old[id(s)] if id(s) in old else fresh[id(s)] for s in secs]).astype(np.float32) if secs else None
    from .facts import with_fallbacks

    whys = {k: n for k, n in (("profile not made or not updated (malformed, refused or failed)", st.failed),
                              ("line refused: markup or prompt text", st.lines_refused),
                              ("line dropped: cites no fact of the person", st.lines_without_facts)) if n}
    out = replace(bank, profiles=tuple(secs), profile_vecs=vecs,
                  stats={**with_fallbacks(bank.stats, "profiles", whys), "profiles_llm": st.to_dict()},
                  layer_sources={**bank.layer_sources, "profiles": "llm"})
    out.validate()
    return out, st
