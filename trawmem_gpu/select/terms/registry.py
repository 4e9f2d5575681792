"""The registry of J's terms: :data:`REGISTRY`, a plain dict filled by :func:`register` when the
``terms`` package imports its modules (one per term), and read by the package's views."""
from __future__ import annotations

from .base import Term

FUSED_BACKENDS = ("numba", "triton")
"""The fused greedies: ``numba`` (``steps/greedy/compiled.py``), ``triton`` (``kernels/greedy.py``)."""

REGISTRY: dict[str, Term] = {}
"""Term name -> the term, in the order the modules registered them (``terms.TERMS`` sorts by position)."""


def register(name: str, weight: str, *, position: int, formula: str, bound: str, learned: bool = False,
             fused: tuple[str, ...] = (), optional: bool = False):
    """Class decorator: build the term ``cls(name, weight, ...)`` and enter it in :data:`REGISTRY`.

    :param position: its place in J's one order (weight columns and the order gains are summed in);
        J's own terms hold 10, 20, ..., 60, a new term the next free one
    :param learned: a learned head sets its weight per query
    :param fused: the fused greedies (of :data:`FUSED_BACKENDS`) that hold its pieces
        (``<name>_gain`` and ``<name>_add`` there)
    :param optional: a coverage term's weight may be left out of ``CoverageWeights`` (0: off)
    """
    def deco(cls: type[Term]) -> type[Term]:
        if name in REGISTRY:
            raise ValueError(f"term {name!r} registered twice "
                             f"({type(REGISTRY[name]).__qualname__}, {cls.__qualname__})")
        bad = set(fused) - set(FUSED_BACKENDS if cls.kind == "coverage" else ())
        if bad:
            raise ValueError(f"term {name!r}: only coverage terms have fused pieces, "
                             f"in {FUSED_BACKENDS} (not {sorted(bad)})")
        REGISTRY[name] = cls(name, weight, formula, bound, learned, tuple(fused), optional, position)
        return cls
    return deco
