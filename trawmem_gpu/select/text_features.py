"""Generic text cues: temporal and relational demand of a question, temporal expressions in units.

The patterns are plain English function words and date forms, not lists fitted to any data
set's names or topics, so they transfer to users' own histories.
"""
from __future__ import annotations

import re

import numpy as np

_MONTHS = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*"
_DAYS = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
# Each question pattern starts with a lookahead on the first letters its alternatives can start
# with: it changes no match (tests/test_select.py checks both) and lets the scan skip other
# positions at once (Python's re would otherwise try every alternative at every position).
TEMPORAL_Q = re.compile(
    r"(?=[wbasfulrdymh])\b(when|what (?:year|month|day|date|time|week)|how long|how many (?:years|months|weeks|days)|"
    r"before|after|since|until|first|last|recently|ago|during|date|year|month|week)\b", re.I)
RELATIONAL_Q = re.compile(
    r"(?=[bacsrtewlmh])\b(both|and|common|share|shared|relationship|between|together|compare|each other|also|"
    r"would|likely|might|why|how many|what kinds?|which)\b", re.I)
TEMPORAL_UNIT = re.compile(
    rf"\b({_MONTHS}|{_DAYS}|yesterday|today|tomorrow|tonight|last (?:week|month|year|night|weekend)|"
    rf"next (?:week|month|year)|(?:19|20)\d\d|\d+ (?:days?|weeks?|months?|years?) ago|ago|weekend|"
    rf"morning|evening|since|recently)\b", re.I)
_NAME = re.compile(r"\b[A-Z][a-z]+\b")


def demand_features(question: str) -> np.ndarray:
    """x_q = (1, z_temp, z_rel, z_len) in [0, 1]^4 from the question text alone."""
    words = question.split()
    z_temp = min(1.0, len(TEMPORAL_Q.findall(question)) / 1.0)
    names = {m for m in _NAME.findall(question)[1:]}  # skip the sentence-initial word
    z_rel = min(1.0, 0.5 * len(RELATIONAL_Q.findall(question)) + 0.5 * max(0, len(names) - 1))
    z_len = min(1.0, len(words) / 25.0)
    return np.array([1.0, z_temp, z_rel, z_len])


def temporal_flags(texts: list[str]) -> np.ndarray:
    """[n] float: 1 where a unit's text holds a temporal expression."""
    return np.array([1.0 if TEMPORAL_UNIT.search(t) else 0.0 for t in texts])
