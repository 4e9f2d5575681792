"""The benchmark suite: one table of its entries, run by ``python -m benchmarks run NAME``.

:data:`SUITE` is the index (``python -m benchmarks list`` prints it; ``benchmarks/README.md``
shows it as a table): each entry's name, its script (a module of this folder, or a shell
script), what it measures, the result files it writes under ``benchmarks/results/`` and how long
a full run takes on the project's 2-core machine (from the timings its result files or docs
record; "not timed" where none is recorded). Every script of this folder is an entry
(``tests/bench/test_bench_runner.py`` checks it), except the modules the scripts share
(:data:`SHARED`). One-off experiments sit in ``experiments/`` and are not entries; they run as
``python -m benchmarks.experiments.NAME`` and write under ``results/archive/``.

Standard library only: importing the package (the test suite imports ``benchmarks.harness``)
costs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One benchmark of the suite."""

    name: str
    """What ``python -m benchmarks run NAME`` takes."""
    script: str
    """Its file in ``benchmarks/`` (a Python module with a ``main()``, or a ``.sh`` run by bash)."""
    measures: str
    """What it measures, one line."""
    results: tuple[str, ...]
    """The files it writes under ``benchmarks/results/`` (or ``TRAWMEM_BENCH_OUT``)."""
    takes: str
    """How long a full run takes on the 2-core machine, and where that figure is recorded."""

    @property
    def module(self) -> str | None:
        """The module to import (``benchmarks.bench_select``); None for a shell script."""
        return None if not self.script.endswith(".py") else "benchmarks." + self.script[:-3]


SUITE: tuple[Entry, ...] = (
    Entry("agreement", "agreement.py",
          "batched engine against the reference selection on LoCoMo dev: identical sets (`--sweep`: H, ablations, T)",
          ("agreement.json",), "not timed"),
    Entry("agent-loop", "bench_agent_loop.py",
          "a LangChain v1 agent loop (create_agent, fake chat model) over the bundled sample: TrawMemMiddleware "
          "against no memory and the hybrid's top turns at the same token budget; workspace tokens, evidence "
          "recall and added latency per model call (`--real URL`: an OpenAI-compatible server)",
          ("agent_loop.json", "agent_loop.png"), "65 s on the loaded 2-core machine (agent_loop.json `wall_s`)"),
    Entry("ann-recall", "bench_ann_recall.py",
          "approximate search of large banks against exact: the candidate pool's and the picks' recall at the "
          "default settings and beside them (synthetic banks of 2e5-5e5 units, latency side by side), quality at "
          "equal tokens on the dev sets with the approximate path forced on",
          ("ann_recall.json", "ann_recall.png", "ann_recall_defaults.json", "ann_recall_defaults.png"),
          "35 min for the three synthetic banks on the loaded 2-core machine, 8 min the dev sets"),
    Entry("compact-memory", "bench_compact_memory.py",
          "compact vectors (float32 / float16 / int8 codes of a large bank's approximate index): its resident "
          "memory, build and append time, search p50 and the proposals' agreement with float32, per bank size "
          "(d = 384), extrapolated to 10^6 units",
          ("compact_memory.json", "compact_memory.png", "compact_memory_ivf.json", "compact_memory_ivf.png"),
          "about 6 min for 3e4 and 1e5 units on the loaded 2-core machine (the points' build_s)"),
    Entry("assembly", "bench_assembly.py",
          "workspace assembly per query (group, render, token count) with and without the per-turn line cache",
          ("assembly.json",), "not timed"),
    Entry("build", "bench_build.py",
          "Stage-1 build cost per conversation (encode, segment, heads, graph) and bank size on disk",
          ("build.json", "build.png", "build-warm.json", "build-warm.png"),
          "45 s of builds (build.json `totals.total_s`)"),
    Entry("e2e_dev_eval", "e2e_dev_eval.py",
          "one full dev-set `trawmem eval` with answers and judging against the local test server, then its resume",
          ("e2e_dev_testserver.json",), "4 min: 224 s, resume 17 s (e2e_dev_testserver.json)"),
    Entry("equal_tokens", "bench_equal_tokens.py",
          "selection quality at equal context tokens on both dev sets, every learned part on held-out folds",
          ("equal_tokens.json", "equal_tokens.md", "equal_tokens.png", "equal_tokens_current.json",
           "equal_tokens_current.md", "equal_tokens_grid_current.json"),
          "29 min all parts (equal_tokens.json); margin + headline 5 min, grid 8 min"),
    Entry("filter", "bench_filter.py",
          "the cost of a where= filter inside the engine against no filter, paired in one run (LoCoMo dev, tagged)",
          ("filter.json", "filter.png"), "not timed"),
    Entry("granularity", "bench_granularity.py",
          "TrawMem over turns and facts beside them (three granularities) on LoCoMo dev",
          ("granularity.json", "granularity.md", "granularity.png"),
          "140 s for `--T 400,800` and two methods (granularity.json)"),
    Entry("supersession", "bench_supersession.py",
          "facts that change over time: the current answer's evidence at equal tokens, today's turns against facts "
          "with and without supersession, on LongMemEval knowledge-update and LoCoMo changed answers",
          ("supersession.json", "supersession.md", "supersession.png"),
          "21 min beside the test suite on the shared machine (supersession.json wall_s)"),
    Entry("head", "bench_head.py",
          "the learned role head on LoCoMo dev: leave-one-conversation-out, then the B table",
          ("head_loco.json", "head_loco.png", "head_table.json"), "15 min (head_table.json: 883 s)"),
    Entry("import-vectors", "bench_import_vectors.py",
          "an import carrying vectors (`trawmem export --vectors`) against one encoding the texts again, side by "
          "side, on one bank of N synthetic turns (`--sizes`, default 500 / 2,000), and the two files' sizes",
          ("import_vectors.json", "import_vectors.png"), "12 min on the loaded 2-core machine (load 11; 736 s for `--sizes 500 2000 --rounds 3`, from the run's log)"),
    Entry("late-insert", "bench_late_insert.py",
          "a late insert (a turn dated before the bank's last turn, stored at its place in time) against an "
          "append at the end, side by side, on one bank of 10^3 / 10^4 / 10^5 synthetic turns (`--sizes`): dated "
          "at the middle, a few minutes before the last turn, and at the middle with every session re-segmented",
          ("late_insert.json", "late_insert.png"),
          "about 12 min `--sizes 1000 10000 --rounds 1` on the loaded 2-core machine; 10^5 not timed"),
    Entry("longmemeval", "bench_longmemeval.py",
          "LongMemEval-S dev: quality of every method at B = 8/16/32, build cost, scoring throughput (Ray too)",
          ("longmemeval.json", "longmemeval.md", "longmemeval.png", "longmemeval-current-defaults.json",
           "longmemeval-current-defaults.png"),
          "54 min with a cold build (longmemeval.md: 3,236 s); warm not timed"),
    Entry("longmemeval_m", "bench_longmemeval_m.py",
          "LongMemEval-M-style haystacks (~500 sessions, united from the dev slice's): quality at equal tokens "
          "against the RRF hybrid and per-query latency, beside the S haystacks",
          ("longmemeval_m.json", "longmemeval_m.md", "longmemeval_m.png"), "not timed"),
    Entry("paper_analyses", "paper_analyses.py",
          "the paper's retrieval-side analyses (Figs. 7-10, 12, Table 3's efficiency), its numbers beside ours",
          ("paper_vs_ours.json", "paper_vs_ours.md", "paper_fig7.json", "paper_fig8.json", "paper_fig9.json",
           "paper_fig10.json", "paper_fig12.json", "paper_table3.json"), "2 min (paper_vs_ours.json: 119 s)"),
    Entry("proxy", "bench_proxy.py",
          "the chat-completions proxy's added latency p50 / p99 over calling the upstream directly, side by side "
          "(a fake upstream at 1, 16, 64 clients; `--real URL`: the llama.cpp server)",
          ("proxy.json", "proxy.png"), "not timed"),
    Entry("quality", "bench_quality.py",
          "selection quality on LoCoMo: the H x B grid, the ablations, the headline table, token budgets",
          ("quality_grid.json", "quality_ablations.json", "quality_headline.json", "quality_tokens.json"),
          "144 s all parts (quality_grid.json)"),
    Entry("scale", "bench_scale.py",
          "how writes, opening and many banks scale: append / forget / compact against one real-text bank's "
          "size, open time and memory against the collection's, a resident budget's hot and cold latency "
          "(and the engine's query curves, scale_bench.query, when present)",
          ("scale.json", "scale.png"), "not timed"),
    Entry("scale-profile", "bench_scale_profile.py",
          "one long bank (the LoCoMo dev conversations repeated): build, open and select, each process's time and peak RSS",
          ("scale_profile.json",), "not timed"),
    Entry("scale-query", "bench_scale_query.py",
          "per-query latency and throughput against one bank's size (10^3 to 10^6 units), the number of banks and "
          "the batch size, with a per-step model of the time", ("scale_query.json", "scale_query.png"), "not timed"),
    Entry("select", "bench_select.py",
          "selection throughput of every implementation side by side; sweeps, scaling, seed search "
          "(`--versus TREE`, `--tokens`, `--gpu-target`)",
          ("select.json", "select.png", "select_scaling.json", "select_scaling.png", "select_versus.json",
           "select_tokens.json", "select_gpu.json"), "5 min (select.json: 307 s, `--rounds 25 --ref-per-round 60`)"),
    Entry("selection_profile", "selection_profile.py",
          "what a config selects under a token budget: units per question, their length, recurrence",
          ("selection_profile.json",), "not timed"),
    Entry("serve", "bench_serve.py",
          "load test of `trawmem serve`: throughput, latency percentiles, batching, appends (`--hostile`: two tenants)",
          ("serve.json", "serve.png", "serve_hostile.json", "serve_versus.json", "serve_fronts.json"),
          "`--hostile`: 185 s (serve_hostile.md); the load test not timed"),
    Entry("serve_memory", "bench_serve_memory.py",
          "the server's memory and latency against the number of distinct (B, H, T), one server per source tree",
          ("serve_memory.json", "serve_memory.png"), "not timed"),
    Entry("synthetic_banks", "synthetic_banks.py",
          "synthetic banks for the selection benchmarks: prints build time and sizes",
          (), "1 min for 10,000 banks of 100 units (its docstring)"),
    Entry("token_costs", "token_costs.py",
          "how close the additive token costs come to the real rendering, and how long counting takes",
          ("token_costs.json",), "not timed"),
    Entry("real_llm", "bench_real_llm.py",
          "every LLM path on a real small model (outcome, calls, malformed / refused / fallback shares, before and "
          "after; constrained or not), and answer F1 and judge with it as reader, TrawMem against the hybrid at T=800",
          ("real_llm_paths.json", "real_llm_answers.json", "real_llm_answers.png"),
          "paths: 30-60 min per run; answers: 1-3 h (the model answers one request at a time)"),
    Entry("transfer", "bench_transfer.py",
          "defaults chosen by transfer: fit on one dev source, score the other and the real-chat views "
          "(split, informal, chat; bursts as units) at equal tokens against the RRF hybrid",
          ("transfer.json", "transfer.md", "transfer.png"), "not timed"),
    Entry("gpu_check", "gpu_check.sh",
          "a bare CUDA host: the CUDA tests and `select --gpu-target`",
          ("gpu_check.json", "gpu_check_env.json", "select_gpu.json"), "under 5 min (its own timeouts)"),
)

SHARED: tuple[str, ...] = ("harness.py", "_boot.py", "__init__.py", "__main__.py")
"""The files of this folder that are not entries: what the scripts share, and the runner."""


def entry(name: str) -> Entry:
    """The entry called ``name`` (or whose script is ``name``, ``bench_select`` or ``bench_select.py``)."""
    for e in SUITE:
        if name in (e.name, e.script, e.script.rsplit(".", 1)[0]):
            return e
    raise KeyError(name)
