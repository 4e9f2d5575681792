"""What a term of J is: :class:`Term` (its name, weight, formula and declarations), the two kinds
(:class:`ModularTerm`, a per-unit value summed over S; :class:`CoverageTerm`, a max over S that owns
its state, gain and update), and what the coverage terms read (:class:`CoverageData`, :class:`Pick`).
A term itself is one module of this package, registered by ``registry.register``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple

import numpy as np


@dataclass(eq=False)
class Term:
    """One term of J: its weight, formula and the bound a lazy greedy may start from, and what it
    declares to the backends. ``registry.register`` builds the one instance of each term class."""

    name: str
    weight: str
    """Its weight: a ``SelectConfig`` field (and a column of the per-query weight matrix)."""
    formula: str = ""
    bound: str = ""
    """The term's marginal gain and the upper bound a lazy greedy may start from."""
    learned: bool = False
    """A learned head sets this weight per query (``terms.LEARNED_WEIGHTS``, the head's file format)."""
    fused: tuple[str, ...] = ()
    """Coverage terms: the fused greedies (of ``registry.FUSED_BACKENDS``) that hold its pieces."""
    optional: bool = False
    """Coverage terms: its weight may be left out of ``objective.CoverageWeights`` (0, the term off)."""
    position: int = 0
    """Its place in J's one order (the weight vectors' columns, the order the gains are summed in)."""
    columns: slice = field(default_factory=lambda: slice(0, 0), repr=False)
    """Its columns of ``terms.unit_attributes`` (set once, when the package derives its views)."""

    kind: ClassVar[str] = ""
    """``modular`` (a per-unit value, summed over S) or ``coverage`` (a max over S)."""
    value: ClassVar[Callable | None] = None
    """Modular terms: ``value(inputs, cfg) -> [..., U]`` (a method)."""
    attributes: ClassVar[tuple[str, ...]] = ()
    """Names of the per-unit columns the term adds to ``terms.unit_attributes`` (its :meth:`unit_columns`)."""

    def unit_columns(self, bank) -> np.ndarray:
        """``[N, len(attributes)]`` float64: the term's own query-independent per-unit inputs."""
        return np.zeros((bank.n_units, 0))


class ModularTerm(Term):
    """A modular term: ``sum_{u in S} value(u)``. Its :meth:`value` is finite and >= 0 (0 where the
    term has nothing to add), so J stays monotone and the lazy greedies' bounds stay upper bounds;
    NumPy arrays and torch tensors alike (``x.alpha``'s type)."""

    kind = "modular"

    def value(self, x, cfg):
        raise NotImplementedError


class CoverageData(NamedTuple):
    """What the coverage terms read: one query (NumPy: ``pi [U]``, ``K [U, U]``, ``rho [U, R]``,
    ``delta [R]``, ``thread [U]`` local thread or -1, ``mass [T]``) or a padded batch (torch: a
    leading ``[Q]`` axis; ``thread`` holds thread column + 1, 0 = none, and ``mass`` a leading 0
    column; padding has zero ``pi`` and ``K``)."""

    pi: object
    K: object
    rho: object
    delta: object
    thread: object
    mass: object
    attrs: object = None
    """The candidates' rows of ``terms.unit_attributes`` (``[U, A]`` / ``[Q, U, A]``), given when a
    term reads them (:attr:`CoverageTerm.reads_attrs`), else None."""
    alpha: object = None
    """The candidates' affinity (``[U]`` / ``[Q, U]``, 0 on padding), read by ``group_affinity``."""


class Pick(NamedTuple):
    """The units whose gains a torch greedy asks for: ``units(x)`` gathers a per-unit tensor
    ``x [Q, U, ...]`` at them (``[Q', k, ...]``), ``query(x)`` takes a per-query tensor's rows."""
    units: Callable
    query: Callable


class CoverageTerm(Term):
    """A coverage term: a max over S, monotone submodular. Each subclass states, once per array
    style, its state (``init``), the marginal gain of a unit (``gain``) and the update when a unit
    enters S (``add``): NumPy for one query (the specification), torch for a padded batch. The
    optimizers call these and never name a term; a fused greedy's pieces restate them."""

    kind = "coverage"
    reads_attrs: ClassVar[bool] = False
    """Whether the term reads the candidates' unit attributes (``CoverageData.attrs``)."""

    # NumPy, one query: the state, the gain of unit u against it, the update when u enters S
    def init(self, d: CoverageData):
        raise NotImplementedError

    def gain(self, d: CoverageData, st, u: int) -> float:
        raise NotImplementedError

    def add(self, d: CoverageData, st, u: int) -> None:
        raise NotImplementedError

    def total(self, d: CoverageData, st) -> float:
        raise NotImplementedError

    def value_of(self, d: CoverageData, S: list[int]) -> float:
        """The term's value on the set ``S`` from scratch (for tests)."""
        st = self.init(d)
        for u in S:
            self.add(d, st, u)
        return self.total(d, st)

    # torch, a padded batch: the same three; ``add_t`` gets ``rows(x)`` (per-unit tensor ``x [Q, U,
    # ...]`` at each query's new unit) and changes only queries ``active [Q]``, returning the new
    # state without updating a float tensor in place (autograd-safe)
    def init_t(self, d: CoverageData):
        raise NotImplementedError

    def gains_t(self, d: CoverageData, st, pick: Pick):
        raise NotImplementedError

    def add_t(self, d: CoverageData, st, rows, active):
        raise NotImplementedError


def keep(active, new, old):
    """``new`` where the query is ``active [Q]``, else ``old`` (a torch state of any rank)."""
    import torch
    return torch.where(active.view(-1, *([1] * (new.dim() - 1))), new, old)
