"""What ``trawmem sweep`` runs (:class:`SweepSpec`: the grid, the data, how cells are timed) and
the result it writes (:func:`sweep_result`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError


@dataclass(frozen=True)
class SweepSpec:
    """One sweep: every field is a ``trawmem sweep`` flag (``eval.sweep.run_sweep`` runs it)."""

    data: str | Path
    """The LoCoMo file the questions and banks come from (``--data``)."""
    methods: tuple = ("trawmem", "hybrid")
    """Methods of the grid (``--method``): ``trawmem``, the baselines, ``trimem``."""
    hops: tuple = (1, 2, 3)
    """H of TrawMem's cells (``--hops``); the baselines have no thread graph."""
    budgets: tuple = (4, 8, 16, 32)
    """Unit budgets B, one cell each (``--budget``)."""
    token_budgets: tuple = ()
    """Token budgets T, one cell each beside the B cells, with no unit cap (``--token-budget``)."""
    paper: bool = False
    """The paper's method and H (``SelectConfig.paper()``, ``PAPER_HOPS``) instead of the defaults."""
    engine: str = "reference"
    """TrawMem's path for the per-query latency: ``reference`` or ``batched`` (``--engine``)."""
    categories: tuple = (1, 2, 3, 4)
    """LoCoMo question categories taken (``--categories``)."""
    batch_size: int = 256
    """Queries per call of the batched throughput measurement (``--batch-size``)."""
    rounds: int = 3
    """Rounds of the throughput measurement (``--rounds``)."""
    threads: int = 1
    """Query threads (torch and engine; ``--threads``)."""
    warmup: int = 10
    """Untimed queries per cell before the timed pass (``--warmup``)."""
    banks_dir: str | Path | None = None
    """A collection holding the banks (``--banks``); None: eval's automatic bank cache."""
    max_questions: int | None = None
    """A seeded sample of at most this many questions (``--max-questions``); None: all."""
    progress: bool = True
    """Progress bars (off with ``--quiet``)."""
    dayfirst: bool = False
    """Read ambiguous dates day first (``--dayfirst``)."""
    time_builds: bool = False
    """Build the banks afresh and time each build once (``--time-builds``)."""
    units: tuple = ("turns",)
    """The layers selection takes units from (``--units``; ``eval.retrieval.layered_banks``)."""
    facts: str | None = None
    """How the facts layer is made, when ``units`` takes one (``--facts``)."""

    def __post_init__(self):
        if self.engine not in ("reference", "batched"):
            raise InputError(f"`engine` must be 'reference' or 'batched', got {self.engine!r}")
        for name in ("methods", "hops", "budgets", "token_budgets", "categories", "units"):
            object.__setattr__(self, name, tuple(getattr(self, name)))


def sweep_result(s: SweepSpec, run: dict) -> dict:
    """The JSON-ready result of sweep ``s`` from what ``run_sweep`` measured (``run``: the
    result's measured fields by name)."""
    from .. import __version__
    from ..paths import file_sha256
    from ..tokens import TOKENIZER_NAME
    from .timing import TIMING_PROTOCOL, machine_info

    return {
        "command": "trawmem sweep", "dataset": {"path": str(s.data), "sha256": file_sha256(s.data),
                                                "dayfirst": s.dayfirst},
        "categories": list(s.categories), "n_questions": run["n_questions"], "mode": "paper" if s.paper else "default",
        "select_config": run["select_config"], "query_params": run["query_params"],
        "build_config": run["build_config"], "encoder": run["encoder"],
        "tokenizer": TOKENIZER_NAME, "engine": s.engine, "package_version": __version__,
        "machine": {**machine_info(), "loadavg_1m_before": run["loadavg_1m_before"]}, "query_threads": s.threads,
        "timing_protocol": TIMING_PROTOCOL, "build": run["build"],
        "context_setup_s": run["context_setup_s"], "encode_ms": run["encode_ms"],
        "pareto_latency_axis": "latency_ms.p50", "pareto_tokens_axis": "context_tokens.mean",
        "cells": run["cells"],
    }
