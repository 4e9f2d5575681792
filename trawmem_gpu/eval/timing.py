"""Timed building blocks of ``trawmem sweep`` and the benchmarks: the machine record, thread
pinning, timed builds and question encodes, and the protocol they follow (:data:`TIMING_PROTOCOL`,
stored with every result)."""
from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager

import numpy as np
from tqdm.auto import tqdm

TIMING_PROTOCOL = """Nothing is cached that a user's next question would not find cached.

- **threads**: BLAS / OpenMP / torch pools are pinned to ``threads`` (default 1) for every
  timed path, builds included (see :func:`query_threads`);
- **build** (``--time-builds`` only): each conversation is built on its own with the embedding
  cache off, after the encoder is loaded and has run once (model loading is a one-off, not a
  per-bank cost);
- **encode**: each question is encoded alone with the embedding cache off;
- **latency**: per cell, ``warmup`` queries run untimed first (numba compilation, first-touch
  allocations), then every query runs alone: selection, then the workspace is assembled and
  rendered to the text an answer model would receive. Cells are interleaved query by query
  (in a random order per query), so load from other processes shifts all cells alike. The engine's
  per-question-text cache is cleared before every timed call; per-bank state (BM25 index,
  context tables, engine tables) is built once per bank and reported as setup, as a server
  would hold it; the stemmer's per-word cache stays warm, as in a running server (the random order
  spreads its first-miss cost evenly over the cells);
- **throughput**: the batched engine selects all questions in batches of ``batch_size`` (mixed
  banks, a fixed shuffle), after one untimed batch; the per-question cache is cleared before
  each round; the cells (one engine, each cell's query parameters) are interleaved round by round
  and the median over ``rounds`` is kept.
"""
"""How ``trawmem sweep`` times things (``:func:`` names refer to this module and ``eval.sweep``)."""


def machine_info() -> dict:
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def build_timed(convs, build_cfg, encoder, llm=None, progress: bool = True) -> tuple[list, list[dict]]:
    """Build each conversation on its own and time it: ``(banks, rows)``, one row per bank with
    ``build_s`` (wall) and the builder's stage seconds. ``encoder`` and ``llm`` should be
    uncached for honest figures; the encoder is warmed once first (model load is a one-off)."""
    from ..ingest import build_banks

    encoder.encode(["warm-up"], is_query=False)
    banks, rows = [], []
    for c in tqdm(convs, desc="build (timed)", disable=not progress):
        t0 = time.perf_counter()
        (bank,), st = build_banks([c], build_cfg, encoder, llm, progress=False)
        wall = time.perf_counter() - t0
        banks.append(bank)
        rows.append({"bank_id": bank.bank_id, "units": bank.n_units, "threads": bank.n_threads,
                     "heads": build_cfg.heads, "segmentation": build_cfg.segmentation, "build_s": wall,
                     **{k: float(v) for k, v in st.items() if k.endswith("_s")},
                     **{k: int(v) for k, v in st.items() if k.endswith("fallbacks")}})
    return banks, rows


def encode_timed(encoder, questions: list[str], warmup: int = 3, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(Z [Q, d], seconds [Q])``: each question encoded alone (``encoder`` uncached)."""
    if questions:
        encoder.encode(questions[:warmup], is_query=True)
    Z, ts = [], []
    for q in tqdm(questions, desc="encode questions (timed, one at a time)", disable=not progress):
        t0 = time.perf_counter()
        Z.append(encoder.encode([q], is_query=True)[0])
        ts.append(time.perf_counter() - t0)
    return (np.stack(Z) if Z else np.zeros((0, encoder.dim), np.float32)), np.asarray(ts)


@contextmanager
def query_threads(n: int):
    """Limit BLAS / OpenMP pools (threadpoolctl) and torch's intra-op pool to ``n`` threads.

    One query's matrices are tiny (about 100 x 384): extra BLAS threads only add hand-offs, and on
    a busy host their spin-waits dominate a query's time. Latency servers pin threads per worker
    for the same reason.
    """
    import torch
    from threadpoolctl import threadpool_limits

    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        torch.set_num_threads(prev)


def clear_query_caches() -> None:
    """Drop caches keyed by question text (a user's new question would miss them)."""
    from ..select import clear_query_caches as clear

    clear()
