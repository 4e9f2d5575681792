"""J's terms, one module each, and the views every backend reads.

Importing this package imports each of its modules; a term module registers its term with
``registry.register`` (a class decorator), so a new term is one new file here (plus its weight, a
``SelectConfig`` field). The views below are derived once from :data:`registry.REGISTRY`, at this
import, and never rebound:

* :data:`TERMS`: the terms in J's one order (their ``position``): the order of every weight vector
  (:data:`WEIGHTS`, then the priority weights of steps 5-6, :data:`QUERY_WEIGHTS`, the columns
  :data:`COL` of every per-query weight matrix) and the order ``objective.combine_gain`` sums in;
* :data:`MODULAR_TERMS`, :data:`COVERAGE_TERMS` (the order of ``objective.CoverageWeights``),
  :data:`TERM_BY_NAME`, :data:`LEARNED_WEIGHTS` (those a learned head sets), :data:`INFORMATION`
  (the coverage term whose state the early stop reads) and :func:`fused_terms` (the coverage terms
  each fused greedy holds; the dispatcher, ``engine/plan.py``, runs a fused greedy only while every
  coverage term with a weight is one of them);
* :data:`UNIT_ATTRIBUTES` and :func:`unit_attributes`: the per-unit columns the terms read, the base
  ones (``unit_inputs.BASE_ATTRIBUTES``) then each term's own (``Term.attributes``, its ``columns``).
"""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np

from ..unit_inputs import BASE_ATTRIBUTES, base_attributes
from .base import CoverageData, CoverageTerm, ModularTerm, Pick, Term
from .registry import FUSED_BACKENDS, REGISTRY, register

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):  # each term module registers its term
    importlib.import_module(f"{__name__}.{_m}")

TERMS: tuple[Term, ...] = tuple(sorted(REGISTRY.values(), key=lambda t: t.position))
"""J's terms, in the one order of every weight vector (their ``position``)."""
TERM_BY_NAME: dict[str, Term] = {t.name: t for t in TERMS}
MODULAR_TERMS: tuple[ModularTerm, ...] = tuple(t for t in TERMS if t.kind == "modular")
COVERAGE_TERMS: tuple[CoverageTerm, ...] = tuple(t for t in TERMS if t.kind == "coverage")
WEIGHTS: tuple[str, ...] = tuple(t.weight for t in TERMS)
"""J's weights (``SelectConfig`` fields), in :data:`TERMS` order."""
PRIORITY_WEIGHTS = ("lambda_m", "lambda_r", "tau")
"""Steps 5-6 weights (costs and priorities); a learned head sets them per query too."""
QUERY_WEIGHTS: tuple[str, ...] = WEIGHTS + PRIORITY_WEIGHTS
"""The columns of every per-query weight matrix (``objective.weight_matrix``)."""
COL: dict[str, int] = {name: i for i, name in enumerate(QUERY_WEIGHTS)}
LAMBDA_M, LAMBDA_R, TAU = COL["lambda_m"], COL["lambda_r"], COL["tau"]
LEARNED_WEIGHTS: tuple[str, ...] = tuple(t.weight for t in TERMS if t.learned) + PRIORITY_WEIGHTS
"""The weights a learned head sets per query: the terms declared ``learned``, then the priority weights."""
INFORMATION: int = COVERAGE_TERMS.index(TERM_BY_NAME["information_coverage"])
"""The index in :data:`COVERAGE_TERMS` of the information coverage, whose state the early stop reads."""


def _check() -> None:
    """Refuse a registry the backends could not read: positions and weights shared by two terms, an
    optional coverage term before a required one (``CoverageWeights`` leaves trailing ones out)."""
    for what in ("position", "weight"):
        seen: dict = {}
        for t in TERMS:
            v = getattr(t, what)
            if v in seen:
                raise ValueError(f"terms {seen[v]!r} and {t.name!r} share the {what} {v!r}")
            seen[v] = t.name
    first_optional = next((k for k, t in enumerate(COVERAGE_TERMS) if t.optional), len(COVERAGE_TERMS))
    late = [t.name for t in COVERAGE_TERMS[first_optional:] if not t.optional]
    if late:
        raise ValueError(f"optional coverage terms must come after every required one (not before {late})")


_check()


def _attribute_columns() -> tuple[str, ...]:
    """The base columns, then each term's own (in :data:`TERMS` order), each term told its slice."""
    names = list(BASE_ATTRIBUTES)
    for t in TERMS:
        t.columns = slice(len(names), len(names) + len(t.attributes))
        names += t.attributes
    return tuple(names)


UNIT_ATTRIBUTES: tuple[str, ...] = _attribute_columns()
"""Query-independent per-unit inputs of the terms (columns of :func:`unit_attributes`)."""
_OWN_COLUMNS = tuple(t for t in TERMS if t.attributes)


def unit_attributes(bank) -> np.ndarray:
    """``[N, len(UNIT_ATTRIBUTES)]`` float64: the per-unit columns the terms read (stored per bank)."""
    base = base_attributes(bank)
    if not _OWN_COLUMNS:
        return base
    return np.concatenate([base] + [np.asarray(t.unit_columns(bank), dtype=np.float64).reshape(
        len(base), len(t.attributes)) for t in _OWN_COLUMNS], axis=1)


def fused_terms(backend: str) -> tuple[str, ...]:
    """The coverage terms whose pieces the fused greedy ``backend`` holds, in ``COVERAGE_TERMS`` order."""
    if backend not in FUSED_BACKENDS:
        raise ValueError(f"no fused greedy {backend!r} (one of {FUSED_BACKENDS})")
    return tuple(t.name for t in COVERAGE_TERMS if backend in t.fused)


__all__ = ["COL", "COVERAGE_TERMS", "CoverageData", "CoverageTerm", "FUSED_BACKENDS", "INFORMATION", "LAMBDA_M",
           "LAMBDA_R", "LEARNED_WEIGHTS", "MODULAR_TERMS", "ModularTerm", "PRIORITY_WEIGHTS", "Pick", "QUERY_WEIGHTS",
           "REGISTRY", "TAU", "TERMS", "TERM_BY_NAME", "Term", "UNIT_ATTRIBUTES", "WEIGHTS", "fused_terms",
           "register", "unit_attributes"]
