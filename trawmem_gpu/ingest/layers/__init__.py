"""Layers of a bank beside its turns (issue 21): source-linked atomic facts and per-person
profile sections (``schema``), how a bank stores them (``store/files.py``), where they come
from (``locomo``: LoCoMo's observations; ``extract``: the LLM hook), and the bank's unit view
for a ``units`` tuple (``view``), which the selection engines take as a bank."""
from ...store.facts import SECTIONS, Fact, ProfileLine, ProfileSection  # noqa: F401
