"""The compiled backend's arguments (``engine/compiled.py``): the loops' NamedTuples of arrays (numba
passes them as structs), the per-snapshot tables they read and the per-chunk stage input."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..objective import ModularInputs, modular_gain, weight_columns
from ..steps.candidates import NO_RANKS, GivenRanks
from ..steps.greedy import config_rule, pick_limit
from ..steps.priority import effective_budget
from ..steps.propagation import ThreadGraph
from .tables import Snapshot

NO_THREADS = np.zeros((0, 0), dtype=np.bool_)
"""``FrontBatch.tlive`` of a batch over whole banks."""


# ----------------------------------------------------------------------------------------------
# the loops' arguments
# ----------------------------------------------------------------------------------------------
class FrontTables(NamedTuple):
    ult: np.ndarray
    """[units] bank-local thread of every stored unit."""
    nbr: np.ndarray
    nbw: np.ndarray
    bm_data: np.ndarray
    bm_idx: np.ndarray
    bm_ptr: np.ndarray


class FrontBatch(NamedTuple):
    bidx: np.ndarray
    cos: np.ndarray
    """Flat cosines: query q's units at ``coff[q] : coff[q] + nu[bidx[q]]``."""
    coff: np.ndarray
    tok_ptr: np.ndarray
    """CSR over ``tok_ids``: each query's BM25 columns (``col0[b] + term``), in token order."""
    tok_ids: np.ndarray
    mask: np.ndarray
    """Flat bool like ``cos``: the units a query's mask keeps (``engine.masks.front_masks``; True
    for a query without one)."""
    masked: np.ndarray
    """[Q] bool: the query has a mask (its failing units hidden, ``steps.mask``; no ``ranks`` given)."""
    ranks: GivenRanks = NO_RANKS
    """Flat like ``cos``: each unit's ranks in its whole bank when the query's units are a
    shortlist of it (``engine/shortlist.py``); empty: ranked among themselves."""
    tlive: np.ndarray = NO_THREADS
    """``[Q, J]`` bool, for queries over a shortlist: the bank's threads that hold a unit the
    query's mask passes (a masked query's thread graph; ``engine/shortlist.py``); empty: the
    threads of the passing units in the query's units."""


class Candidates(NamedTuple):
    """Steps 1-3 output per query row (written by :func:`front_loop`)."""

    cand: np.ndarray
    """[Qc, U] bank-local candidate units, ascending."""
    n_cand: np.ndarray
    lt: np.ndarray
    """[Qc, U] neighbourhood position of each candidate's thread."""
    alpha: np.ndarray
    hthread: np.ndarray
    """[Qc, T] the neighbourhood's bank-local threads, ascending (-1 pad)."""
    rvec: np.ndarray
    """[Qc, T] their r~ (0 pad)."""
    n_h: np.ndarray
    tpos: np.ndarray
    """[Qc, J] a bank thread's neighbourhood position, -1 outside."""


class StageTables(NamedTuple):
    ktab: np.ndarray
    btab: np.ndarray
    head_sim: np.ndarray
    temporal: np.ndarray
    position: np.ndarray
    d_in: np.ndarray
    graph: ThreadGraph
    tok_unit: np.ndarray
    """[units] token cost of every stored unit (``workspace.TokenCosts``; 0 without a token budget)."""
    tok_head: np.ndarray  # [threads] heading token cost of every stored thread
    tok_hrun: np.ndarray  # [threads] the bank-local first thread of every stored thread's heading run
    linked: np.ndarray  # [units] 1 where a unit has a support link


class StageBatch(NamedTuple):
    """Steps 4-7 input per query row: its bank, the candidates (see :class:`Candidates`), J's
    modular part, the demand (``Mq``, ``delta``), the weights ``W [Qc, len(QUERY_WEIGHTS)]``, B_q
    of the priority cap, the pick limit and the token budget."""

    bidx: np.ndarray
    cand: np.ndarray
    n_cand: np.ndarray
    lt: np.ndarray
    alpha: np.ndarray
    modular: np.ndarray
    hthread: np.ndarray
    rvec: np.ndarray
    n_h: np.ndarray
    tpos: np.ndarray
    Mq: np.ndarray
    delta: np.ndarray
    W: np.ndarray
    budget: np.ndarray
    limit: np.ndarray
    capacity: np.ndarray
    """[Qc] each query's token budget T (``inf``: none)."""
    bridge: np.ndarray
    """[Qc, U] the bridge of the queries ``own`` marks (``engine.masks.stage_bridge``)."""
    own: np.ndarray
    """[Qc] bool: the bridge is ``bridge``'s row (a mask cut a thread of a bank with tables); the
    other queries' bridge is read off ``btab`` or formed from the candidates (``pool.QueryTables``)."""


class StageParams(NamedTuple):
    T_R: float
    c_hop: float
    cross_thread: bool
    identity: bool
    k_shift: float
    stop_coverage: float
    keys: int
    """Knapsack greedy keys (``SelectConfig.knapsack``): -1 both (the better kept), 0 gain, 1 gain per token."""


def stage_params(cfg) -> StageParams:
    keys = {None: -1, False: 0, True: 1}[cfg.knapsack_ratio]
    return StageParams(float(cfg.T_R), float(cfg.c_hop), bool(cfg.cross_thread), cfg.kernel == "identity",
                       float(cfg.k_shift), float(cfg.stop_coverage), keys)


def front_tables(snap: Snapshot) -> FrontTables:
    n = snap.np
    return FrontTables(n["unit_thread"], n["nbr"], n["nbw"], n["bm_data"], n["bm_idx"], n["bm_ptr"])


def stage_tables(snap: Snapshot) -> StageTables:
    n = snap.np
    return StageTables(n["ktab"], n["btab"], n["head_sim"], n["temporal"], n["position"], n["d_in"], ThreadGraph(
        n["nbr"], n["nbw"], snap.dummy_thread), n["tok_unit"], n["tok_head"], n["tok_hrun"], n["linked"])


def stage_batch(snap: Snapshot, cfg, cols: dict, Mq, delta, W: np.ndarray, now: np.ndarray, unit_cap: np.ndarray,
                pool: np.ndarray, capacity: np.ndarray) -> StageBatch:
    """A :class:`StageBatch` from NumPy columns (``cols``: the :class:`Candidates` fields and
    ``bidx``, and ``bridge`` / ``own`` of a masked chunk, ``engine.masks.stage_bridge``); J's modular part from ``objective.modular_gain``, B_q and the limit from the rule;
    per query (``[Qc]``): ``unit_cap`` B (0 = no cap), ``pool`` ``QueryParams.pool_budget``,
    ``capacity`` T (``inf`` = none)."""
    c = {k: np.ascontiguousarray(v) for k, v in cols.items()}
    n_cand, cand = c["n_cand"], c["cand"]
    def attrs():  # the candidates' unit attributes, gathered only if a term with a weight reads them
        valid = np.arange(cand.shape[1])[None, :] < n_cand[:, None]
        return snap.np["attrs"][snap.off.uo[c["bidx"]][:, None] + np.where(valid, cand, 0)]

    modular = modular_gain(ModularInputs(c["alpha"], attrs, now[:, None]), weight_columns(W), cfg)
    budget = effective_budget(np.asarray(pool, dtype=np.int64), n_cand)
    limit = pick_limit(config_rule(cfg, np.asarray(unit_cap, dtype=np.int64), n_cand), n_cand)
    return StageBatch(bidx=c["bidx"], cand=cand, n_cand=n_cand, lt=c["lt"], alpha=c["alpha"],
                      modular=np.ascontiguousarray(modular), hthread=c["hthread"], rvec=c["rvec"], n_h=c["n_h"],
                      tpos=c["tpos"], Mq=np.ascontiguousarray(Mq), delta=np.ascontiguousarray(delta),
                      W=np.ascontiguousarray(W), budget=budget.astype(np.int64), limit=np.asarray(limit, np.int64),
                      capacity=np.ascontiguousarray(capacity, dtype=np.float64),
                      bridge=c.get("bridge", np.zeros((len(n_cand), 1))),
                      own=c.get("own", np.zeros(len(n_cand), np.bool_)))
