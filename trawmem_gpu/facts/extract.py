"""The LLM hook of ``build --facts llm``: atomic facts over overlapping windows of turns.

The *trimem* task fills :func:`extract_facts` (TriMem's extraction prompt, 40-turn windows,
malformed replies and unknown ids counted and retried once). Its contract, which the build
(``facts.build.attach_facts``) relies on:

* ``conversation_turns``: the turns to extract from, in source order (on ``--update``, the new turns
  only, with up to ``overlap`` turns before them as context);
* returns ``(facts, stats)``: :class:`~trawmem_gpu.facts.schema.Fact` records whose
  ``source_turns`` are ids of ``conversation_turns`` and whose ids are unique among themselves
  (the build renumbers them bank-unique), and a dict of counts (windows, malformed, retried, ...).
"""
from __future__ import annotations

from ..data.types import Turn
from ..errors import ConfigError
from .schema import Fact

WINDOW = 40
"""Turns per extraction window (TriMem's best)."""
OVERLAP = 10
"""Turns two consecutive windows share."""


def extract_facts(conversation_turns: list[Turn], backend, *, window: int = WINDOW, overlap: int = OVERLAP,
                  prompts=None) -> tuple[list[Fact], dict]:
    """Atomic facts of ``conversation_turns`` by the LLM ``backend`` (see the module docstring)."""
    raise ConfigError("`facts` 'llm': the extraction is not available in this build yet (use 'locomo' or 'none')")
