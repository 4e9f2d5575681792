"""Stage-2 configuration: ``SelectConfig`` (the method) apart from ``EngineConfig`` (how it runs)
and from ``params.QueryParams`` (what each query asks for: B, H, T, passed per call).

``SelectConfig`` holds every choice of the method that can change *which* units a query gets,
the same for every query an engine answers (its bank tables depend on some of them);
``SelectConfig()``
is the shipped default (why each default: ``docs/method-defaults.md``) and ``SelectConfig.paper()`` the method exactly as Section 4.2 writes it
(head-vector seeds, additive propagation, dense affinity, objective weights of 1). The six
ablations of Section 5.2 are switches (``ablation=...``).

``EngineConfig`` holds every choice of how :class:`~trawmem_gpu.select.engine.SelectionEngine`
computes those units (device, dtype, backend, kernels, threads, chunking, tables, seed search):
none of them changes a pick. Errors name the field in backquotes (```rrf_k` must be >= 1 (got 0)``); the command
line maps fields to its flags.
"""
from __future__ import annotations

import math
import numbers
import typing
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Literal

from ..dictconfig import DictFields
from ..errors import ConfigError
from ..store.vectors import DEFAULT_VECTORS, check_vectors
from .weights_file import load_weights
from .workspace import DEFAULT_HEADINGS, Headings

ABLATIONS = ("none", "fixed_segmentation", "no_cross_edges", "seed_only", "no_role_conditioning", "identity_k",
             "no_multi_thread")

# Roles (anchor, bridge, context) x demand features (1, z_temp, z_rel, z_len).
DEFAULT_A = ((1.0, 0.0, 0.0, 0.0),
             (0.2, 0.0, 1.0, 0.5),
             (0.2, 1.0, 0.0, 0.2))
# Roles x unit features (1, alpha, thread score, bridge, head sim, temporal, position).
DEFAULT_M = ((0.0, 4.0, 1.0, 0.0, 0.0, 0.0, 0.0),
             (0.0, 1.0, 0.5, 4.0, 0.0, 0.0, 0.0),
             (0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 0.0))
UNIT_FEATURES = ("bias", "alpha", "thread_score", "bridge", "head_sim", "temporal", "position")
DEMAND_FEATURES = ("bias", "z_temp", "z_rel", "z_len")
ROLES = ("anchor", "bridge", "context")
PAPER_HOPS = 2
"""H of the paper's configuration (``SelectConfig.paper``), a per-query choice."""
RELEVANCE_FEATURES = ("cos", "bm25", "rrf_cos", "rrf_bm25", "top_cos", "top_bm25", "speaker_named", "temporal_match",
                      "context_cos", "context_rrf", "date_match", "words")
"""Features of the ``learned`` affinity, in the order of ``relevance_weights`` (defined in
``steps/relevance.py``)."""
WEIGHTS_PATH = Path(__file__).with_name("affinity_weights.json")
"""The shipped ``learned`` affinity's weights file (package data; ``bench_equal_tokens.py --parts fit`` writes it)."""
DEFAULT_RELEVANCE_WEIGHTS = load_weights(WEIGHTS_PATH, RELEVANCE_FEATURES)
"""The shipped ``learned`` affinity, one weight per RELEVANCE_FEATURES entry, then the bias: the
package's ``affinity_weights.json`` (its one home; how it was fitted and validated:
``docs/method-defaults.md``)."""
LEGACY_FIELDS = frozenset({"budget", "token_budget", "hops", "fill", "n_seeds", "neighborhood_cap"})
"""Fields an older SelectConfig had and ``from_dict`` still accepts (and ignores): the per-query
fields, now ``QueryParams`` (``params.split_fields`` splits a stored config that holds both)."""


@lru_cache(maxsize=None)
def _choices(cls) -> dict[str, tuple]:
    """``{field: allowed values}`` for every ``Literal`` field of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {name: typing.get_args(tp) for name, tp in hints.items() if typing.get_origin(tp) is Literal}


def _check_choices(obj) -> None:
    for name, allowed in _choices(type(obj)).items():
        val = getattr(obj, name)
        if val not in allowed:
            raise ConfigError(f"`{name}` must be one of {', '.join(repr(a) for a in allowed)} (got {val!r})")


def _at_least(name: str, val, low, strict: bool = False) -> None:
    if (val <= low) if strict else (val < low):
        raise ConfigError(f"`{name}` must be {'>' if strict else '>='} {low} (got {val!r})")


def _within(name: str, val, lo, hi, hi_open: bool = False) -> None:
    if not (lo <= val < hi if hi_open else lo <= val <= hi):
        raise ConfigError(f"`{name}` must lie in [{lo}, {hi}{')' if hi_open else ']'} (got {val!r})")


@dataclass
class SelectConfig(DictFields):
    """How one query's workspace is selected from one bank (the method, Section 4.2)."""

    knapsack: Literal["best", "gain", "ratio"] = "gain"
    """TrawMem's greedy under a token budget: ``best`` = the cost-aware greedy (the better by J of
    the gain-ranked and the gain-per-token-ranked greedy, each adding only units that still fit:
    the stated guarantee, ``steps/greedy.py``), or only one of the two runs (``gain``,
    ``ratio``). ``best`` keeps the stated guarantee on J, which is not the same as more
    evidence."""
    headings: Headings = DEFAULT_HEADINGS
    """What TrawMem's workspace shows per thread, and its token costs pay for
    (``select.workspace.HEADINGS``): a ``## date`` heading (the default), the heading with the thread
    head's gist (``gist``), or no headings and a date on every line (``none``). It changes no pick
    without a token budget."""
    gamma: float = 0.7
    """Propagation: r~(T_k) = gamma * r(T_j) + (1 - gamma) * w_H(T_j, T_k) (max over paths)."""
    propagation: Literal["paper", "damped"] = "damped"
    """``paper`` applies Eq. 4 as written (a neighbour of a weak seed can outscore the seed);
    ``damped`` uses r(T_j) * (gamma + (1 - gamma) * w), never above its source."""
    d_idx: Literal["l2", "cosine"] = "l2"
    """Seed distance for r0 = 1 / (1 + d_idx(z, h)): L2 between unit vectors, or 1 - cos."""
    seed_score: Literal["head", "best_unit", "max"] = "best_unit"
    """r0 of a thread: from its head vector (paper), from its best unit's affinity, or the max."""
    affinity: Literal["dense", "fused", "rrf", "learned"] = "learned"
    """alpha(v): ``dense`` = (1 + cos(z, e_v)) / 2 (the paper); ``fused`` = (1 - w) * dense +
    w * bm25 / max_bank(bm25) with w = ``lexical_weight``; ``rrf`` = reciprocal-rank fusion of
    cosine and BM25 over the bank (k = ``rrf_k``), divided by its bank maximum; ``learned`` =
    sigmoid(relevance_weights . f_q(v)) over generic relevance features (dense, lexical, their
    ranks, speaker named, temporal and date cues, session context: ``steps/relevance.py``),
    divided by its bank maximum."""
    lexical_weight: float = 0.5
    """Weight of BM25 in the ``fused`` affinity."""
    rrf_k: int = 60
    """k of the reciprocal-rank fusion in the ``rrf`` affinity (and of the ``learned`` affinity's rank features)."""
    relevance_weights: tuple = DEFAULT_RELEVANCE_WEIGHTS
    """Weights of the ``learned`` affinity: one per ``RELEVANCE_FEATURES`` entry, then the bias
    (``trawmem train-affinity`` fits them; the default: :data:`DEFAULT_RELEVANCE_WEIGHTS`)."""
    lambda_m: float = 1.25
    """Cost weight of query mismatch (1 - alpha) (the paper's value)."""
    lambda_r: float = 0.0
    """Cost weight of role misfit (1 - phi); 0 = no role conditioning of the priorities (the
    default: at equal tokens the roles showed no gain, ``docs/method-defaults.md``; the paper: 0.5)."""
    tau: float = 0.25
    """Temperature of exp(-C / tau) in the priorities."""
    T_R: float = 0.5
    """Role softmax temperature."""
    A: tuple = DEFAULT_A
    """Roles x demand features: delta = A x / 1^T A x."""
    M: tuple = DEFAULT_M
    """Roles x unit features; M(delta) = M * (1 + delta) row-wise."""
    c_head: float = 1.0
    """Local graph: cost of the unit-head edge is c_head * (1 - cos(h_j, e_v))."""
    c_step: float = 0.25
    """Local graph: cost between adjacent units of a thread."""
    c_hop: float = 0.5
    """Local graph: cost of a head-head edge is c_hop + (1 - w_H)."""
    kernel: Literal["cosine", "identity"] = "cosine"
    """K(u, v): the cosine of the two units shifted by ``k_shift`` and clipped to [0, 1], with
    K(v, v) = 1 (``objective.support_from_cosine``), or the identity."""
    k_shift: float = 0.3
    """Cosine at or below which a unit supports another not at all (0 = plain clipped cosine)."""
    fact_support: float = 0.5
    """With facts or profiles as units (``--units``): the least support K(u, v) of a unit for
    one it restates (a fact for its source turn; ``objective.support_floor``). A fact is a lossy
    restatement: below 1; its source turn supports the fact fully."""
    w_cov: float = 1.0
    """Weight of the information-coverage term of J."""
    w_role: float = 0.0
    """Weight of the role-coverage term of J (0 by default, like ``lambda_r``; the paper: 1)."""
    w_aff: float = 16.0
    """Weight of the affinity sum of J (the paper: 1). Above the coverage weights, relevance leads
    and coverage breaks ties among near-equals."""
    w_thr: float = 0.0
    """Weight of the thread-coverage term of J (0 by default, like ``cross_thread``; the paper: 1)."""
    w_grp: float = 0.0
    """Weight of the group affinity of J (``terms/group_affinity.py``): with support links (facts as
    units), the affinity of a restatement group (a fact and its source turns) counts once, as the max
    over its picked units, and the grouped units leave the affinity sum. ``w_grp = w_aff`` counts
    every unit's affinity at the same weight, once per group; 0 = off (a fact and its turn both count)."""
    w_rec: float = 0.0
    """Weight of the recency bonus of J (needs the query's date; 0 = off, the paper's J)."""
    recency_half_life_days: float = 30.0
    """Recency bonus of a unit dated ``age`` days before the query: 2^(-age / this)."""
    stop_coverage: float = 1.01
    """Greedy stops once sum_v pi(v) max_S K >= this (> 1 never stops early)."""
    greedy: Literal["lazy", "plain"] = "lazy"
    """How the reference (``select_reference``) maximizes J: lazy greedy (stale upper bounds)
    or plain greedy. Both pick exactly the same units; so does every engine path, whose own
    maximizer is ``EngineConfig.optimizer``."""
    cross_thread: bool = False
    """Cross-thread support (K across threads, priorities from other heads); off for No Multi-thread
    and by default (at equal tokens the multi-thread term showed no gain, ``docs/method-defaults.md``;
    the paper: on)."""
    semantic_edges: bool = True
    """Use semantic (k-nearest-head) edges of G_H; off for No Cross-Edge."""
    ablation: str = "none"
    """One of ABLATIONS; applied by ``resolved()``. ``fixed_segmentation`` is a build switch."""

    def __post_init__(self):
        _within("gamma", self.gamma, 0.0, 1.0)
        _within("lexical_weight", self.lexical_weight, 0.0, 1.0)
        for name in ("tau", "T_R", "recency_half_life_days"):
            _at_least(name, getattr(self, name), 0, strict=True)
        for name in ("lambda_m", "lambda_r", "c_head", "c_step", "c_hop") + _objective_weights():
            _at_least(name, getattr(self, name), 0)
        _within("k_shift", self.k_shift, 0.0, 1.0, hi_open=True)
        _within("fact_support", self.fact_support, 0.0, 1.0)
        if self.ablation not in ABLATIONS:
            raise ConfigError(f"`ablation` must be one of {', '.join(repr(a) for a in ABLATIONS)} "
                              f"(got {self.ablation!r})")
        _at_least("rrf_k", self.rrf_k, 1)
        _check_choices(self)
        self.relevance_weights = tuple(float(x) for x in self.relevance_weights)
        if len(self.relevance_weights) != len(RELEVANCE_FEATURES) + 1 or not all(
                math.isfinite(x) for x in self.relevance_weights):
            raise ConfigError(f"`relevance_weights` must be {len(RELEVANCE_FEATURES) + 1} finite numbers (one per "
                              f"relevance feature: {', '.join(RELEVANCE_FEATURES)}; then the bias)")
        self.A = tuple(tuple(float(x) for x in r) for r in self.A)
        self.M = tuple(tuple(float(x) for x in r) for r in self.M)
        if len(self.A) != len(ROLES) or any(len(r) != len(DEMAND_FEATURES) for r in self.A):
            raise ConfigError(f"`A` must be {len(ROLES)} x {len(DEMAND_FEATURES)} (roles x demand features)")
        if len(self.M) != len(ROLES) or any(len(r) != len(UNIT_FEATURES) for r in self.M):
            raise ConfigError(f"`M` must be {len(ROLES)} x {len(UNIT_FEATURES)} (roles x unit features)")

    @classmethod
    def paper(cls, **kw) -> "SelectConfig":
        """Section 4.2 as written: head seeds, Eq. 4 propagation, dense affinity, unit weights, and
        thread heads shown in the workspace. Under a token budget (beyond the paper, which has B
        only) its greedy keeps the paper's rule, the unit of largest gain that still fits
        (``knapsack="gain"``): with the dense affinity every unit adds about 1/2 to J whatever its
        relevance, so the set of most units has the largest J and the cost-aware ``best`` would keep
        its gain-per-token run, the shortest turns in the bank (``docs/method-defaults.md``).
        The paper's H = 2 is a per-query choice: ``QueryParams(hops=PAPER_HOPS)``."""
        return cls(**(PAPER | kw))

    @classmethod
    def default(cls, name: str, paper: bool = False):
        """The default of field ``name`` (under :meth:`paper` with ``paper``), without building a
        config (a help text reads it without importing the objective's compiled code)."""
        if paper and name in PAPER:
            return PAPER[name]
        f = cls.__dataclass_fields__[name]
        return f.default

    @property
    def knapsack_ratio(self) -> bool | None:
        """``TokenBudget.ratio`` for :attr:`knapsack`: None (both runs), False (gain), True (ratio)."""
        return {"best": None, "gain": False, "ratio": True}[self.knapsack]

    def resolved(self) -> "SelectConfig":
        """The config with its ablation applied (idempotent). ``seed_only`` is a per-query
        change (no hops), applied by ``QueryParams.resolved``."""
        a = self.ablation
        if a == "no_cross_edges":
            return replace(self, semantic_edges=False)
        if a == "no_role_conditioning":
            return replace(self, lambda_r=0.0, w_role=0.0)
        if a == "identity_k":
            return replace(self, kernel="identity")
        if a == "no_multi_thread":
            return replace(self, cross_thread=False, w_thr=0.0)
        return self

    KIND = "selection config"
    LEGACY = LEGACY_FIELDS


PAPER = dict(seed_score="head", propagation="paper", affinity="dense", k_shift=0.0, w_cov=1.0, w_role=1.0,
             w_aff=1.0, w_thr=1.0, lambda_r=0.5, cross_thread=True, headings="gist", knapsack="gain")
"""The fields :meth:`SelectConfig.paper` sets: Section 4.2 as written."""
ROLE_TERMS = dict(lambda_r=0.5, w_role=1.0)
"""Role conditioning (the paper's, Section 5.4), off in the defaults: the ``no_role_conditioning`` ablation undone."""
MULTI_THREAD = dict(cross_thread=True, w_thr=1.0)
"""The multi-thread term (the paper's), off in the defaults: the ``no_multi_thread`` ablation undone."""


def _objective_weights() -> tuple[str, ...]:
    from .terms import WEIGHTS  # the terms' registry owns its weights' names and order

    return WEIGHTS


@dataclass(frozen=True)
class EngineConfig:
    """How :class:`~trawmem_gpu.select.engine.SelectionEngine` runs the method. No field changes
    which units are selected (every backend is tested to pick what ``select_reference`` picks),
    except ``ann_min_units`` for the banks at or above it (approximate search of large banks)."""

    device: str | None = None
    """torch device; None = CUDA when present, else CPU."""
    dtype: Literal["auto", "float32", "float64"] = "auto"
    """Compute dtype; ``auto`` = float64 on CPU (the reference's precision), float32 on CUDA."""
    backend: Literal["auto", "compiled", "tensor"] = "auto"
    """``compiled``: numba loops, one query at a time in cache (CPU; needs numba and the per-bank
    tables); ``tensor``: torch ops over padded batches of queries (Triton kernels on CUDA);
    ``auto``: compiled on CPU where it applies, else tensor."""
    front: Literal["auto", "compiled", "tensor"] = "auto"
    """Steps 1-3 on the compiled backend: ``compiled`` (one numba loop per query after the
    similarity GEMM; needs the ``rrf`` or ``learned`` affinity, ``best_unit`` seeds, float64 and
    plain bm25s scores), ``tensor`` (the torch steps) or ``auto`` (compiled where it applies)."""
    kernels: Literal["auto", "torch", "triton"] = "auto"
    """Tensor backend: run the priority and greedy ops as Triton kernels (``auto``: on CUDA when
    triton and the kernels import) or as torch ops."""
    optimizer: Literal["auto", "lazy", "plain"] = "auto"
    """Tensor backend's maximizer of J: ``lazy`` (batched lazy greedy, torch) or ``plain`` (one
    full gain sweep per step: the Triton kernel on CUDA, a torch loop elsewhere); ``auto`` = plain
    on CUDA, lazy on CPU. The compiled backend always runs its exact lazy greedy."""
    sim: Literal["auto", "grouped", "global", "gather", "dots"] = "auto"
    """Query-unit (and query-head) similarities: ``grouped`` (one GEMM per distinct bank of the
    batch), ``global`` (one GEMM against every stored row, then a gather), ``gather`` (each
    query's bank rows gathered, batched mat-vec), ``dots`` (CPU, numba: per-query dot products
    over the own bank) or ``auto`` (see :func:`~trawmem_gpu.select.engine.batch.sim_mode`)."""
    threads: int | None = None
    """Worker threads of the compiled backend (chunks of queries in parallel; the compiled loops
    release the GIL); None = ``torch.get_num_threads()``."""
    chunk_elems: int | None = None
    """Tensor backend: bound on ``Qc * U * U`` per chunk of the greedy step; None = 2^19 on CPU
    (cache-sized), 2^24 on CUDA. The compiled backend cuts chunks at ``Qc * U * max(T, 8) <= 2^22``."""
    table_bytes: int = 1 << 31
    """Build the per-bank support-kernel and bridge tables while the banks given at construction
    (those of at most ``table_max_units`` units) need at most this many bytes for them (0: never;
    the greedy step then forms K and the bridge from the candidates' vectors per query)."""
    table_max_units: int = 2048
    """Largest bank (in units) that gets the per-bank support-kernel and bridge tables. They hold
    ``N^2 + N J`` floats, so a bank past this size forms K and the bridge from its candidates'
    vectors per query instead (``[U, U]`` per query, the same values): the engine's memory stays
    linear in the bank (``docs/configuration.md``, bank size)."""
    seed_search: Literal["auto", "torch", "faiss"] = "auto"
    """Head-seed search (``seed_score="head"``): faiss or batched per-bank similarity, both
    exact; ``auto`` picks by the thresholds in ``steps/seeds.py``."""
    ann_min_units: int | Literal["auto"] | None = "auto"
    """Smallest bank (in units) whose searches are approximate (``auto``: by the vectors' width,
    where the measured exact search costs twice the approximate one: ``engine.plan.ann_threshold``;
    None: never): the compiled front scores a
    working set of the bank around an approximate faiss index's shortlist instead of every unit
    (``engine/shortlist.py``), and head seeds come from an approximate index over its heads
    (``steps/seeds.py``). Smaller banks, the tensor front (CUDA: one exact GEMM) and None: exact.
    This is the one field of ``EngineConfig`` that may change picks (``docs/configuration.md``,
    large banks: the candidate pool's recall against exact search and the quality at equal tokens)."""
    ann_shortlist: int = 128
    """Units the approximate search proposes per query by cosine (and as many again by BM25) to
    seed the working set; the index's best ``shortlist.RANK_DEPTH`` (1,024) rank it. 128 kept the
    whole candidate pool and every pick on a 100,000-unit bank (d = 384, 100 topics) and 0.98 of
    them at 10^6 units (``benchmarks/results/large_bank_sweep.json``, ``docs/scaling.md``, large
    banks); it was 1,024 when the shortlist also had to hold the ranks."""
    ann_nprobe: int = 32
    """IVF lists probed per query (passed with each search; the lists are chosen by size,
    ``steps/ann.py``). On real text (the LoCoMo dev turns repeated to 10^5 units, MiniLM vectors)
    16 kept 0.944 of the candidate pool and 0.936 of the picks, 32 and 48 kept 0.9943 / 0.9953 and
    64 all of the pool and 0.9953 of the picks; up to which copy of a repeated turn was taken
    (the copies' vectors tie) 32, 48 and 64 all keep the whole pool
    (``benchmarks/results/realtext_settings.json``, ``realtext_settings_nprobe.json``). On the
    synthetic 10^6-unit bank 32, 48 and 64 keep the same pool and picks (0.9903 / 0.9906), 32
    about 0.45 ms a query faster than 64 (p50 medians 9.29 / 9.74 ms, 3 interleaved rounds;
    ``large_bank_sweep.json``, ``ab_fast5ms4``). It was 64 until then."""
    ann_ef_search: int = 1024
    """HNSW search breadth per query (passed with each search; raised to ``ann_shortlist`` when
    smaller). With a 512-unit shortlist, 64 (512 in effect) kept 0.988 of the candidate pool at
    500,000 units and 1024 kept 0.995 (``benchmarks/results/ann_recall.json``)."""
    ann_index: Literal["auto", "hnsw", "ivf"] = "auto"
    """The approximate index: ``hnsw`` (graph, no training), ``ivf`` (k-means lists; on a GPU when
    faiss has one) or ``auto`` (by size: ``steps.ann.IVF_MIN_VECTORS``)."""
    vectors: str = DEFAULT_VECTORS
    """The codes the approximate index of a large bank holds (``store.vectors.VECTOR_KINDS``):
    ``float32`` (a flat copy), ``float16`` or ``int8`` (faiss scalar-quantizer codes), ``pq`` (faiss
    product-quantizer codes on an IVF index, ``d / 8`` bytes a vector; ``int8`` codes on a smaller
    index); every proposal is still re-scored exactly. A ``Memory`` sets it from its collection's
    recorded choice."""

    def __post_init__(self):
        _check_choices(self)
        if self.threads is not None:
            _at_least("threads", self.threads, 1)
        if self.chunk_elems is not None:
            _at_least("chunk_elems", self.chunk_elems, 1)
        _at_least("table_bytes", self.table_bytes, 0)
        _at_least("table_max_units", self.table_max_units, 0)
        if self.ann_min_units is not None and self.ann_min_units != "auto":
            if isinstance(self.ann_min_units, str):
                raise ConfigError(f"ann_min_units must be a whole number, 'auto' or None, got {self.ann_min_units!r}")
            _at_least("ann_min_units", self.ann_min_units, 1)
        for name in ("ann_shortlist", "ann_nprobe", "ann_ef_search"):
            _at_least(name, getattr(self, name), 1)
        check_vectors(self.vectors)

    def with_overrides(self, **kw) -> "EngineConfig":
        """A copy with ``kw`` applied; unknown names raise a ConfigError listing the fields."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(kw) - known)
        if unknown:
            hint = ""
            if "greedy" in unknown:
                hint = " (the engine's old greedy= option is now backend= 'compiled' | 'tensor' and optimizer=)"
            elif "gram_bytes" in unknown:
                hint = " (gram_bytes is now table_bytes)"
            elif "impl" in unknown:
                hint = " (impl is now kernels)"
            raise ConfigError(f"unknown engine options {unknown}; EngineConfig has {sorted(known)}{hint}")
        return replace(self, **kw)
