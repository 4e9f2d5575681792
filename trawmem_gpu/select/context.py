"""Per-bank, query-independent precomputation of the reference selection (and the unit features
the batched engine stores per bank too)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..store.graph import SEMANTIC
from ..store.bank import Bank
from ..store.turn_columns import embed_texts, field_of
from .workspace import DEFAULT_HEADINGS, token_costs
from .lexical import BM25Index
from .objective import support_floor
from .terms import unit_attributes
from .steps.relevance import RelevanceStatic, relevance_static
from .text_features import temporal_flags


def unit_features(bank: Bank) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query-independent unit features ``(head_sim, temporal, position)``, each ``[N]``:
    cos(h_thread(v), e_v), a temporal-expression flag, and the position in the thread in [0, 1]."""
    ut = bank.unit_thread
    off = bank.thread_offsets
    idx = np.arange(bank.n_units)
    lens = np.diff(off)[ut]
    pos = np.where(lens > 1, (idx - off[ut]) / np.maximum(lens - 1, 1), 0.0)
    head_sim = np.empty(bank.n_units)
    for s in range(0, bank.n_units, _ROWS):  # in blocks: the float64 copies stay small (each row's sum is the same)
        b = slice(s, s + _ROWS)
        head_sim[b] = np.einsum("nd,nd->n", bank.unit_vecs[b].astype(np.float64), bank.head_vecs[ut[b]].astype(np.float64))
    return head_sim, temporal_flags(field_of(bank.turns, "text")), pos


_ROWS = 1024
"""Units per block of :func:`unit_features`' cosines (whole, a large bank's two ``[N, d]`` float64
copies cost more to allocate than the products)."""


@dataclass
class BankContext:
    bank: Bank
    unit_thread: np.ndarray
    """[N] thread of each unit."""
    position: np.ndarray
    """[N] relative position of each unit in its thread, in [0, 1]."""
    head_sim: np.ndarray
    """[N] cos(h_thread(v), e_v)."""
    temporal: np.ndarray
    """[N] 1 where the unit's text holds a temporal expression."""
    bm25: BM25Index
    adj: list[list[tuple[int, float, int]]]
    """Per thread: (neighbour, weight, kind) over G_H."""
    attrs: np.ndarray
    """[N, A] the per-unit inputs of J's modular terms (``terms.unit_attributes``)."""
    relevance: RelevanceStatic
    """The query-independent inputs of the ``learned`` affinity's features."""
    _token_costs: dict = field(default_factory=dict, repr=False, compare=False)
    _floors: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, bank: Bank) -> "BankContext":
        head_sim, temporal, pos = unit_features(bank)
        texts = embed_texts(bank.turns)
        adj: list[list] = [[] for _ in range(bank.n_threads)]
        for s, d, w, k in zip(bank.edge_src, bank.edge_dst, bank.edge_w, bank.edge_kind):
            adj[int(s)].append((int(d), float(w), int(k)))
        return cls(bank, bank.unit_thread, pos, head_sim, temporal, BM25Index(texts), adj, unit_attributes(bank),
                   relevance_static(bank, temporal))

    def token_costs(self, headings: str = DEFAULT_HEADINGS):
        """The bank's ``select.workspace.TokenCosts`` under ``headings``, counted on first use."""
        if headings not in self._token_costs:
            self._token_costs[headings] = token_costs(self.bank, headings)
        return self._token_costs[headings]

    def support_floor(self, cand: np.ndarray, cfg) -> np.ndarray | None:
        """``[U, U]`` the support links' floor of K between the candidates ``cand``
        (``objective.support_floor``), None when the bank has no links."""
        key = float(cfg.fact_support)
        if key not in self._floors:
            self._floors[key] = support_floor(self.bank, cfg)
        F = self._floors[key]
        return None if F is None else F[np.ix_(cand, cand)]

    def neighbours(self, j: int, semantic: bool):
        return [(d, w) for d, w, k in self.adj[j] if semantic or k != SEMANTIC]

    def in_thread_dist(self, units: np.ndarray, c_head: float, c_step: float) -> np.ndarray:
        """Shortest cost from each unit's own head to it inside its thread.

        The head links to every unit of its thread with cost c_head * (1 - cos(h, e_u)); adjacent
        units are linked with cost c_step; so dist(v) = min_u c_head (1 - cos(h, e_u)) + c_step |u - v|.
        """
        out = np.empty(len(units))
        off = self.bank.thread_offsets
        for i, v in enumerate(units):
            j = self.unit_thread[v]
            us = np.arange(off[j], off[j + 1])
            out[i] = np.min(c_head * (1.0 - self.head_sim[us]) + c_step * np.abs(us - v))
        return out
