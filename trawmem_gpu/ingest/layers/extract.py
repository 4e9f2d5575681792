"""The LLM hook of ``build --facts llm``: atomic facts over overlapping windows of turns.

The extraction itself is TriMem's (``ingest.layers.trimem_extract``: the extraction prompt, 40-turn windows,
malformed replies, unknown ids and empty windows counted and retried once). Its contract, which
the build (``ingest.layers.facts.attach_facts``) relies on:

* ``conversation_turns``: the turns to extract from, in source order (on ``--update``, the new turns
  only, with up to ``overlap`` turns before them as context);
* ``existing``: on ``--update``, the bank's stored facts: a sentence one of them already states is
  not extracted again (TriMem's rule, ``ingest.layers.trimem_extract``);
* returns ``(facts, stats)``: :class:`~trawmem_gpu.store.facts.Fact` records whose
  ``source_turns`` are ids of ``conversation_turns`` and whose ids are unique among themselves
  (the build renumbers them bank-unique), and a dict of counts (windows, malformed, retried, ...).
"""
from __future__ import annotations

from typing import Sequence

from ...data.types import Turn
from .trimem_extract import OVERLAP, WINDOW  # noqa: F401 (the build's window defaults)
from .trimem_extract import extract_facts as trimem_extract
from ...store.facts import Fact


def extract_facts(conversation_turns: list[Turn], backend, *, window: int = WINDOW, overlap: int = OVERLAP,
                  prompts=None, existing: Sequence[Fact] = ()) -> tuple[list[Fact], dict]:
    """Atomic facts of ``conversation_turns`` by the LLM ``backend`` (see the module docstring);
    ``prompts``: a ``ingest.layers.prompts.PromptSet`` (``build --prompts``; None: the built-in prompts)."""
    facts, st = trimem_extract(list(conversation_turns), backend, prompts, window=window, overlap=overlap,
                               existing=existing)
    return facts, {k: v for k, v in st.to_dict().items() if k != "prompt"}
