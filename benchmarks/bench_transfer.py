"""Defaults chosen by transfer between sources, on real-chat views of the dev sets (issue 36).

    python -m benchmarks run transfer [--locomo PATH] [--lme PATH] [--views plain,split,informal,chat]
        [--T 400,800] [--variants defaults,words-none,...] [--cache TAG] [--out-dir benchmarks/results]

Protocol (nothing is tuned on what it is scored on):

* **Sets.** LoCoMo dev and the LongMemEval-S dev slice, each plain and under the real-chat views of
  ``trawmem_gpu.data.chat_views`` (``split``: each turn its sentences, seconds apart; ``informal``;
  ``chat``: split, informal, minutes apart, typos and emoji). A view's banks are built from the
  view's messages (bank cache keyed by the view); selection takes their burst view (``store.bursts``).
  Evidence recall counts gold **messages** shown (a view maps a gold turn to every message it
  became; a burst unit shows all its members).
* **Fits.** The learned affinity's weights of a candidate are fitted on one source's *plain* set
  (``head.relevance.fit_relevance``): on LoCoMo (scored on LongMemEval and its views: transfer; on
  LoCoMo's own views: one conversation held out at a time, the within-source folds) and on
  LongMemEval (the reverse; its within-source folds are its 5 question folds). ``--parts views``
  also scores today's protocol (weights per fold fitted on the other 11 folds of both sources).
* **Columns.** Each (fit source, scored set, T) is a column: TrawMem's macro evidence recall, its
  margin over the RRF hybrid at equal context tokens (paired bootstrap within category, 95%), and
  LoCoMo's multi-hop all-evidence hit beside the hybrid's. The hybrid runs in its standard
  configuration on the stronger of two unit sets, the bursts TrawMem selects from or the raw
  messages (the one with the higher mean macro recall over the T's, per set; both are reported).
* **Candidates** (``--variants``, ``transfer_bench.variants``): the shipped defaults, and one
  choice changed each: the ``words`` feature's form (none, rank or z-score within the bank, the
  capped log of issue 25), roles and the multi-thread term on, ``knapsack="best"`` or
  ``"ratio"``, messages instead of bursts. A candidate **survives** when no column loses to the defaults: the paired
  interval of its macro recall minus the defaults' (and of LoCoMo's multi-hop hit) is not wholly
  below 0.

Writes ``transfer.json`` (every table and the per-set statistics), ``transfer.md`` and
``transfer.png`` under ``--out-dir`` (or ``TRAWMEM_BENCH_OUT``). The parts live in
``benchmarks/transfer_bench/``. ``--cache TAG`` keeps fits and picks under the bench cache (a
rerun with more variants selects only the new ones; a new source tree needs a new tag).

Experiment switch (off by default): ``TRAWMEM_BENCH_UNIT_VECS="split=encoded"`` (or
``plain=sentence-mean``, ...) forms the named views' unit vectors another way
(``transfer_bench.unit_vecs``: a burst's joined text encoded, or a unit's sentences' mean); the
form enters the view spec and the cache keys. Its results: ``results/transfer_burst_vectors.json``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import sys
import time
from pathlib import Path

from . import harness

PARTS = ("views", "table")


def main() -> int:
    from .transfer_bench.variants import VARIANTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=harness.dev_data("locomo"))
    ap.add_argument("--lme", type=Path, default=harness.dev_data("longmemeval"))
    ap.add_argument("--views", default="plain,split,informal,chat")
    ap.add_argument("--sources", default="locomo,longmemeval", help="the dev sources (both for the transfer columns)")
    ap.add_argument("--lme-views", help="LongMemEval's views, when not --views (its views are costly to build)")
    ap.add_argument("--T", default="400,800")
    ap.add_argument("--parts", default="views,table")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--lme-view-banks", type=int, default=50,
                    help="LongMemEval's views on a seeded sample of this many banks (0: all; default %(default)s)")
    ap.add_argument("--cache", help="keep fits and picks in the bench cache under this tag")
    ap.add_argument("--out-dir", type=Path, help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    bad = sorted(parts - set(PARTS)) or sorted(set(a.variants.split(",")) - set(VARIANTS))
    if bad:
        ap.error(f"unknown part or variant {bad[0]!r}; parts: {', '.join(PARTS)}; variants: {', '.join(VARIANTS)}")
    harness.require_data(a.locomo, "locomo", "--locomo")
    harness.require_data(a.lme, "longmemeval", "--lme")
    a.out_dir = harness.results_dir(a.out_dir)
    with harness.pin_threads(1):
        return run(a, parts)


def run(a, parts: set) -> int:
    from .transfer_bench import report
    from .transfer_bench.run import Run

    t0 = time.perf_counter()
    r = Run({"locomo": a.locomo, "longmemeval": a.lme}, a.views.split(","), [int(x) for x in a.T.split(",")],
            a.cache, a.lme_view_banks, tuple(a.sources.split(",")), a.lme_views.split(",") if a.lme_views else None)
    res: dict = {"protocol": __doc__, "machine": harness.machine(), "command": harness.command(),
                 "sets": r.set_stats(), "T": r.Ts}
    res["hybrid"] = r.hybrid_table()
    if "views" in parts:
        res["views"] = r.views_table()
    if "table" in parts:
        res["table"] = r.transfer_table(a.variants.split(","))
        res["verdict"] = r.verdicts(res["table"])
    res["seconds"] = round(time.perf_counter() - t0, 1)
    with harness.locked("transfer", a.out_dir) as old:  # a partial run keeps the other parts' tables
        old.update(res)
        harness.write_text(a.out_dir / "transfer.md", report.markdown(old))
        out = harness.save("transfer", old, report.plot(old), out_dir=a.out_dir, dpi=110)
    print(f"wrote {out} ({res['seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
