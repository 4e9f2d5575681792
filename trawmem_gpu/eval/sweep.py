"""``trawmem sweep``: quality, context length and latency over a hops x budget grid.

For every cell of the grid (method, H, B or T): macro evidence recall, macro all-evidence hit,
multi-hop (category 1) all-evidence hit, context tokens (mean, p90; tiktoken ``cl100k_base``)
and the retrieval latency of one query at a time (p50 / p95 / p99); for TrawMem cells also the
batched engine's throughput at a stated batch size. Baselines have no thread graph, so they get
one cell per B. Token budgets (``--token-budget``) add cells at T tokens per workspace (no
unit cap; TrawMem under its knapsack, baselines filled in rank order) beside the B cells, so
methods compare at equal context tokens. Banks come from eval's automatic bank cache (or
``--banks``); with ``--time-builds`` they are built afresh and the build cost is measured once
per bank. Question encoding is timed once per question (neither depends on H or B). The
Pareto-optimal cells (recall against latency, and against tokens) are marked in the JSON, the
table (its letters explained under it) and the plot.

How time is measured: :data:`~trawmem_gpu.eval.timing.TIMING_PROTOCOL` (stored in every result).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..errors import InputError
from ..select.client import run
from .analyses import describe
from .sweep_report import format_table, mark_pareto, plot_pareto  # noqa: F401 (the command's, from here)
from .sweep_spec import SweepSpec, sweep_result
from .timing import build_timed, clear_query_caches, encode_timed, machine_info, query_threads

__all__ = ["Cell", "CellRunner", "SweepSpec", "grid", "run_sweep", "run_cells", "interleave", "batched_throughput",
           "build_timed", "encode_timed", "machine_info", "query_threads", "question_items", "parse_int_list"]

TRAWMEM = "trawmem"
BASELINES = ("cosine", "bm25", "hybrid")
SWEEP_METHODS = (TRAWMEM, *BASELINES, "trimem")  # select.trimem.method without planning: cells like a baseline's


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a unit budget B, or a token budget T (then ``budget`` is None: no
    unit cap)."""

    method: str
    budget: int | None
    hops: int | None = None
    """H for TrawMem; None for baselines (no thread graph)."""
    token_budget: int | None = None
    """T (workspace tokens); None = a unit-budget cell."""

    @property
    def key(self) -> str:
        size = f"B={self.budget}" if self.token_budget is None else f"T={self.token_budget}"
        return f"{self.method} {size}" + ("" if self.hops is None else f" H={self.hops}")

    def params(self, base=None):
        """The cell's ``QueryParams``: its budget (or token budget) and H, the rest from ``base``
        (a ``QueryParams``; None = the defaults)."""
        from ..select.params import merge_params

        return merge_params({"budget": self.budget, "token_budget": self.token_budget,
                             **({} if self.hops is None else {"hops": self.hops})}, base)


def grid(methods, hops, budgets, token_budgets=()) -> list[Cell]:
    """TrawMem cells for every H x (B, then T), baseline cells for every B and T, in that order."""
    cells = []
    sizes = [(int(b), None) for b in budgets] + [(None, int(t)) for t in token_budgets]
    for m in methods:
        if m not in SWEEP_METHODS:
            raise InputError(f"`methods`: unknown method {m!r}; choose from {', '.join(SWEEP_METHODS)}")
        cells += [Cell(m, b, int(h), t) for h in hops for b, t in sizes] if m == TRAWMEM else \
            [Cell(m, b, None, t) for b, t in sizes]
    return cells


def parse_int_list(text: str, minimum: int) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]`` (order kept, duplicates dropped); ``InputError`` otherwise."""
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise InputError("expected at least one value")
    bad = [v for v in vals if v < minimum]
    if bad:
        raise InputError(f"every value must be at least {minimum}, got {bad[0]}")
    return list(dict.fromkeys(vals))


def _scores(selected_ids, gold) -> tuple[float, float]:
    from .retrieval import _scores as scores  # one home for evidence recall / all-evidence hit

    return scores(selected_ids, gold)


class SharedEngine:
    """The one batched engine of a grid (every cell's query parameters are per call), built on
    first use; ``setup_s`` times the build."""

    def __init__(self, banks: dict, cfg, threads: int = 1):
        self.banks, self.cfg, self.threads = banks, cfg, threads
        self._eng, self.setup_s = None, None

    def get(self):
        if self._eng is None:
            from ..select.engine import SelectionEngine

            t0 = time.perf_counter()
            self._eng = SelectionEngine(list(self.banks.values()), self.cfg, threads=self.threads)
            self.setup_s = time.perf_counter() - t0
        return self._eng


class CellRunner:
    """One cell's selection for one query at a time, with its method, its query parameters and
    (for a TrawMem cell with ``engine="batched"``, or for the throughput) the grid's engine.
    :param base_params: the ``QueryParams`` the cell's B / T / H replace (None = the defaults)
    :param shared: the grid's :class:`SharedEngine` (None: one of its own)
    """

    def __init__(self, cell: Cell, banks: dict, ctxs: dict, base_cfg, engine: str = "reference", threads: int = 1,
                 base_params=None, shared: SharedEngine | None = None):
        self.cell, self.banks, self.ctxs, self.threads = cell, banks, ctxs, threads
        self.cfg = base_cfg
        self.params = cell.params(base_params)
        self.batched = cell.method == TRAWMEM and engine == "batched"
        self.engine_name = "batched" if self.batched else "reference"
        self.shared = shared or SharedEngine(banks, base_cfg, threads)
        self.records: list[dict] = []
        self.selections: list = []
        if cell.method == "trimem":  # per-bank setup before any query is timed; workspaces from its views
            from ..select.trimem.method import TriMemRankers
            self.trimem = TriMemRankers.prepared(banks)
            self.banks = {b: r.view for b, r in self.trimem.items()}

    def engine(self):
        """The grid's batched engine (built once; ``setup_s`` times it)."""
        return self.shared.get()

    @property
    def setup_s(self) -> float | None:
        return self.shared.setup_s

    def select(self, bid: str, question: str, Z: np.ndarray, i: int):
        """``(units, Selection or None)`` for query ``i`` (``Z[i]`` its vector)."""
        from ..select.baselines import baseline_units
        from ..select.reference import select_reference

        m, ctx = self.cell.method, self.ctxs.get(bid)
        if m == TRAWMEM:
            if self.batched:
                return run(self.engine(), [bid], [question], Z[i:i + 1], self.params)[0], None
            s = select_reference(ctx, question, Z[i], self.cfg, self.params, keep_internals=True)
            return s.units, s
        if m == "trimem":
            return self.trimem[bid].plain_units(question, Z[i], self.params), None
        return baseline_units(m, ctx, question, Z[i], self.cfg, self.params), None

    def run_one(self, items: list, Z: np.ndarray, i: int, keep: bool = False, record: bool = True) -> None:
        """Select query ``i`` alone, assemble and render its workspace, time both, score it."""
        from ..select.workspace import assemble, headings_for

        bid, q = items[i]
        clear_query_caches()
        t0 = time.perf_counter()
        units, s = self.select(bid, q.question, Z, i)
        t1 = time.perf_counter()
        ws = assemble(self.banks[bid], q.question, units, headings_for(self.cell.method, self.cfg))
        ws.render()
        t2 = time.perf_counter()
        if not record:
            return
        recall, hit = _scores(ws.unit_ids, q.evidence)
        self.records.append({"qid": q.qid, "bank_id": bid, "category": q.category, "evidence_recall": recall,
                             "all_evidence_hit": hit, "context_tokens": ws.n_tokens, "n_selected": len(ws.unit_ids),
                             "n_candidates": None if s is None else int(len(s.candidates)),
                             "select_s": t1 - t0, "latency_s": t2 - t0})
        if keep:
            self.selections.append(s)


def run_cells(cells: list[Cell], banks: dict, ctxs: dict, items: list, Z: np.ndarray, base_cfg, *,
              engine: str = "reference", threads: int = 1, base_params=None, **timed) -> list[CellRunner]:
    """Select every query of ``items`` (``(bank_id, Question)``) alone in every cell and time it.

    The cells are interleaved query by query, in a fresh (seeded) random order per query, so a
    change in machine load shifts every cell alike instead of biasing whichever cell ran at the
    time, and no cell always follows the same neighbour (whose memory traffic would leave it the
    same warm or cold caches every time).
    Each runner's ``records`` hold metrics only (no text): qid, bank, category, evidence recall,
    all-evidence hit, context tokens, selected and candidate counts, ``select_s`` (selection
    alone) and ``latency_s`` (selection + assembling and rendering the workspace);
    ``selections`` the reference's :class:`Selection` per query when ``keep_selections``.
    ``timed``: :func:`interleave`'s keywords (``warmup``, ``keep_selections``, ``progress``, ``desc``).
    """
    shared = SharedEngine(banks, base_cfg, threads)  # one engine, one set of tables, for the whole grid
    runners = [CellRunner(c, banks, ctxs, base_cfg, engine, threads, base_params, shared) for c in cells]
    return interleave(runners, items, Z, **({"desc": "select (cells interleaved)"} | timed))


def interleave(runners: list[CellRunner], items: list, Z: np.ndarray, *, warmup: int = 10,
               keep_selections: bool = False, progress: bool = True, desc: str = "select") -> list[CellRunner]:
    """The timed pass of :func:`run_cells` over ready runners (which may differ in config)."""
    for r in runners:
        for i in range(min(warmup, len(items))):
            r.run_one(items, Z, i, record=False)
    rng = np.random.default_rng(0)
    for i in tqdm(range(len(items)), desc=desc, disable=not progress):
        for k in rng.permutation(len(runners)):
            runners[k].run_one(items, Z, i, keep=keep_selections)
    return runners


def batched_throughput(engine, params: list, items: list, Z: np.ndarray, batch_size: int, rounds: int = 3,
                       seed: int = 0) -> list[dict]:
    """Queries per second of ``engine.select_units`` (through ``select.client.run``) over all ``items`` in batches of
    ``batch_size`` (a fixed shuffle, so batches mix banks as a server's would), once per entry of
    ``params`` (``QueryParams``); the entries interleaved round by round, median over rounds."""
    if batch_size < 1:
        raise InputError("`batch_size` must be >= 1")
    Q = len(items)
    order = np.random.default_rng(seed).permutation(Q)
    bids = [items[i][0] for i in order]
    qs = [items[i][1].question for i in order]
    Zo = Z[order]
    for p in params:  # untimed warm-up batch
        run(engine, bids[:batch_size], qs[:batch_size], Zo[:batch_size], p)
    per_round: list[list[float]] = [[] for _ in params]
    for r in range(max(1, rounds)):
        k = r % max(1, len(params))
        for e in list(range(k, len(params))) + list(range(k)):
            clear_query_caches()
            t0 = time.perf_counter()
            for s in range(0, Q, batch_size):
                run(engine, bids[s:s + batch_size], qs[s:s + batch_size], Zo[s:s + batch_size], params[e])
            per_round[e].append(Q / (time.perf_counter() - t0))
    return [{"batch_size": int(batch_size), "rounds": len(pr), "queries": Q, "threads": int(engine.threads),
             "device": str(engine.device), "qps": float(np.median(pr)), "qps_rounds": [float(x) for x in pr]}
            for pr in per_round]


def cell_metrics(records: list[dict], categories, encode_s: np.ndarray | None = None) -> dict:
    """Macro quality, tokens and latency percentiles of one cell's records."""
    from .retrieval import aggregate

    agg = aggregate(records, keys=("evidence_recall", "all_evidence_hit", "context_tokens"), categories=categories)
    toks = describe([r["context_tokens"] for r in records])
    lat = np.array([r["latency_s"] for r in records]) * 1e3
    out = {"evidence_recall": agg["macro"].get("evidence_recall", float("nan")),
           "all_evidence_hit": agg["macro"].get("all_evidence_hit", float("nan")),
           "multi_hop_hit": agg["per_category"].get("1", {}).get("all_evidence_hit", float("nan")),
           "per_category": agg["per_category"],
           "context_tokens": {"mean": toks["mean"], "p90": toks["p90"], "p95": toks["p95"]},
           "latency_ms": _pcts(lat),
           "select_ms": _pcts(np.array([r["select_s"] for r in records]) * 1e3),
           "n_questions": len(records)}
    cands = [r["n_candidates"] for r in records if r.get("n_candidates") is not None]
    if cands:
        out["candidates_mean"] = float(np.mean(cands))
    if encode_s is not None and len(encode_s) == len(records):
        out["with_encode_ms"] = _pcts(lat + np.asarray(encode_s) * 1e3)
    return out


def _pcts(ms: np.ndarray) -> dict:
    d = describe(ms)
    return {"p50": d["median"], "p95": d["p95"], "p99": d["p99"], "mean": d["mean"]}


# ----------------------------------------------------------------------------------------------
# the sweep

def question_items(convs, categories, max_questions: int | None = None, seed: int = 0) -> list:
    """``(bank_id, Question)`` for questions of ``categories`` with gold evidence, in file order
    (``max_questions``: a seeded sample of that many, still in file order)."""
    items = [(c.bank_id, q) for c in convs for q in c.questions if q.category in categories and q.evidence]
    if not items:
        raise InputError(f"no question of categories {list(categories)} has gold evidence in the data")
    if max_questions is not None and max_questions < len(items):
        if max_questions < 1:
            raise InputError("`max_questions` must be >= 1")
        keep = np.sort(np.random.default_rng(seed).choice(len(items), max_questions, replace=False))
        items = [items[i] for i in keep]
    return items


def load_or_build_banks(convs, banks_dir, build_cfg, progress: bool = True, *, time_builds: bool = False,
                        data_path=None, dayfirst: bool = False) -> tuple[list, list[dict], str]:
    """Banks for ``convs``: timed fresh builds (``time_builds``), the banks of an existing
    collection ``banks_dir`` (through the shared check against the data,
    ``store.verify.verify_banks``), or else eval's automatic bank cache for ``data_path`` (built
    there once, with the embedding cache: :func:`~trawmem_gpu.eval.retrieval.banks_for`). Build
    rows of reused banks come from the seconds stored with each bank (``source``)."""
    from ..encode import get_encoder

    if time_builds:
        if banks_dir is not None:
            raise InputError("`time_builds` measures fresh builds; it does not take `banks_dir`")
        banks, rows = build_timed(convs, build_cfg, get_encoder(build_cfg.encoder, cache=False), progress=progress)
        return banks, rows, "measured now: one conversation at a time, embedding cache off"
    from .retrieval import banks_for

    if banks_dir is None:
        _, banks, _ = banks_for(data_path, build_cfg, None, progress, get_encoder(build_cfg.encoder),
                                dayfirst=dayfirst, convs=convs)
    else:
        from ..errors import BankError
        from ..store import Collection
        from ..store.verify import verify_banks

        coll = Collection(banks_dir)
        try:
            missing = verify_banks(coll, convs, data_path or "`data`", None, exact=False)
        except BankError as e:
            raise BankError(f"`banks_dir` {banks_dir}: {e}; rebuild them from `data` or leave `banks_dir` "
                            "unset") from None
        if missing:
            raise InputError(f"`banks_dir` {banks_dir}: no bank for conversation(s) {missing[:5]} of `data`")
        banks = [coll.load(c.bank_id) for c in convs]
    rows = []
    for b in banks:
        st = (b.stats or {}).get("build", {})
        rows.append({"bank_id": b.bank_id, "units": b.n_units, "threads": b.n_threads,
                     "build_s": st.get("wall_s"), "embedding_cache_hits": st.get("embedding_cache_hits")})
    return banks, rows, "stored with the banks when they were built (may include embedding-cache hits)"


def run_sweep(spec: SweepSpec | str | Path, *args, **fields) -> dict:
    """Run the whole grid of ``spec``; the JSON-ready result. ``run_sweep(data, methods, hops,
    budgets, **fields)`` runs ``SweepSpec(data, methods, hops, budgets, **fields)``."""
    from ..ingest.config import BuildConfig
    from ..data import load_conversations, require_locomo
    from ..encode import get_encoder
    from ..select.config import PAPER_HOPS, SelectConfig
    from ..select.context import BankContext
    from ..select.params import merge_params

    s = spec if isinstance(spec, SweepSpec) and not (args or fields) else SweepSpec(spec, *args, **fields)
    cells = grid(s.methods, s.hops, s.budgets, s.token_budgets)
    base_cfg = SelectConfig.paper() if s.paper else SelectConfig()
    base_params = merge_params({"hops": PAPER_HOPS} if s.paper else None)
    build_cfg = BuildConfig()
    require_locomo(s.data, "sweep")  # the one sniffer: LongMemEval has no LoCoMo categories or multi-hop hit
    convs = load_conversations(s.data, dayfirst=s.dayfirst)
    items = question_items(convs, s.categories, s.max_questions)
    with query_threads(s.threads):
        banks_list, build_rows, build_source = load_or_build_banks(convs, s.banks_dir, build_cfg, s.progress,
                                                                   time_builds=s.time_builds, data_path=s.data,
                                                                   dayfirst=s.dayfirst)
    from .retrieval import layered_banks  # the layers and the bursts (eval's rule)

    banks_list = layered_banks(banks_list, s.data, s.units, s.facts, get_encoder(build_cfg.encoder),
                               dayfirst=s.dayfirst)
    banks = {b.bank_id: b for b in banks_list}
    encoder = get_encoder(build_cfg.encoder, cache=False)
    if banks_list[0].encoder_id != encoder.id:
        raise InputError(f"banks were encoded with {banks_list[0].encoder_id!r}, the encoder is {encoder.id!r}")
    t0 = time.perf_counter()
    ctxs = {b: BankContext.of(bank) for b, bank in banks.items()}
    if any(cell.token_budget is not None for cell in cells):  # per-bank setup of the T cells, not a query's cost
        from ..select.workspace import headings_for

        for c in ctxs.values():
            for h in {headings_for(cell.method, base_cfg) for cell in cells}:
                c.token_costs(h)
    ctx_s = time.perf_counter() - t0
    load0 = machine_info()["loadavg_1m"]
    with query_threads(s.threads):
        Z, enc_s = encode_timed(encoder, [q.question for _, q in items], progress=s.progress)
        runners = run_cells(cells, banks, ctxs, items, Z, base_cfg, engine=s.engine, warmup=s.warmup,
                            threads=s.threads, progress=s.progress, base_params=base_params)
        tm = [r for r in runners if r.cell.method == TRAWMEM]
        tps = batched_throughput(tm[0].engine(), [r.params for r in tm], items, Z, s.batch_size, s.rounds) if tm else []
    tp_of = {id(r): t for r, t in zip(tm, tps)}
    out_cells = []
    for r in runners:
        c = r.cell
        row = {"key": c.key, "method": c.method, "hops": c.hops, "budget": c.budget, "token_budget": c.token_budget,
               "engine": r.engine_name,
               **cell_metrics(r.records, s.categories, enc_s), "throughput": tp_of.get(id(r))}
        if id(r) in tp_of:
            row["engine_setup_s"] = r.setup_s
        out_cells.append(row)
    mark_pareto(out_cells)
    build = {"source": build_source, "per_bank": build_rows, "mean_build_s": _mean([r["build_s"] for r in build_rows])}
    return sweep_result(s, {"n_questions": len(items), "select_config": base_cfg.to_dict(),
                            "query_params": base_params.to_dict(), "build_config": build_cfg.to_dict(),
                            "encoder": encoder.id, "loadavg_1m_before": load0, "build": build,
                            "context_setup_s": ctx_s, "encode_ms": _pcts(enc_s * 1e3), "cells": out_cells})


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None
