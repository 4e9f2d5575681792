"""The burst-vector diagnostic's gaps with intervals (issue 36): TrawMem's margin over the hybrid on
a view minus its margin on plain, paired by question (every view asks the plain set's questions,
in its order), a category-stratified bootstrap (``equal_tokens_bench.stats.margin_bootstrap`` of
the per-question margins). Reads the picks the runs of ``vecs_table`` kept in the bench cache
(nothing is selected again; the sets are loaded to score them).

    python -m benchmarks.transfer_bench.vecs_gap OUT.json [--views split,chat] [--T 400,800]

adds ``"gaps"`` to ``OUT.json`` (``vecs_table``'s file) and prints its table. The cache tags and
forms are those of the runs in ``results/transfer.md`` (``RUNS``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

RUNS = {"mean": ("bv-mean", ""), "encoded": ("bv-enc", "split=encoded,chat=encoded"),
        "sentence-mean": ("bv-smean", "plain=sentence-mean")}
"""Form -> (cache tag, ``TRAWMEM_BENCH_UNIT_VECS``) of each run."""
PAIRS = (("same vectors (bench)", ("mean", "mean"), ("mean", "mean")),
         ("fair hybrid, TrawMem mean", ("mean", "sentence-mean"), ("mean", "mean")),
         ("fair hybrid, TrawMem encoded on the view", ("mean", "sentence-mean"), ("encoded", "mean")))
"""(name, (TrawMem's, hybrid's) forms on plain, (TrawMem's, hybrid's) forms on the view)."""


def records(views: list[str], Ts: list[int]) -> dict:
    """``{(who, form, set label, T): records}`` for TrawMem (``defaults``, fit on LoCoMo) and the
    hybrid (bursts) under each run's form."""
    from benchmarks import harness

    from .run import Run
    from .unit_vecs import ENV

    out: dict = {}
    for form, (tag, env) in RUNS.items():
        os.environ[ENV] = env
        r = Run({"locomo": harness.dev_data("locomo"), "longmemeval": harness.dev_data("longmemeval")},
                ["plain"] + (views if form != "sentence-mean" else []), Ts, tag, 0, ("locomo",))
        for key, ds in r.sets.items():
            for T in Ts:
                out[("trawmem", form, ds.label, T)] = r.trawmem(key, "defaults", "locomo", T)["records"]
                out[("hybrid", form, ds.label, T)] = r.hybrid(key, "bursts", T)["records"]
                out[("qids", ds.label)] = [q.qid for q in ds.questions]
        out[("ds",)] = r.sets[("locomo", "plain")]
    os.environ.pop(ENV, None)
    return out


def gaps(rec: dict, views: list[str], Ts: list[int]) -> list[dict]:
    from ..equal_tokens_bench.stats import margin_bootstrap

    ds, rows = rec[("ds",)], []

    def margins(forms, label, T):
        t, h = rec[("trawmem", forms[0], label, T)], rec[("hybrid", forms[1], label, T)]
        return [{"cat": a["cat"], "recall": a["recall"] - b["recall"]} for a, b in zip(t, h)]

    for view in views:
        label = f"locomo/{view}"
        assert rec[("qids", label)] == rec[("qids", "locomo/plain")]
        for name, on_plain, on_view in PAIRS:
            for T in Ts:
                m = margin_bootstrap(ds, margins(on_view, label, T), margins(on_plain, "locomo/plain", T), 4000)
                rows.append({"view": view, "T": T, "pair": name, "plain_forms": on_plain, "view_forms": on_view,
                             "gap": m["margin"], "ci95": m["ci95"]})
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--views", default="split,chat")
    ap.add_argument("--T", default="400,800")
    a = ap.parse_args(argv)
    views, Ts = a.views.split(","), [int(x) for x in a.T.split(",")]
    rows = gaps(records(views, Ts), views, Ts)
    res = json.loads(a.out.read_text())
    res["gaps"] = {"about": __doc__, "runs": RUNS, "rows": rows}
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print("| view | T | TrawMem / hybrid vectors: plain; view | gap [95%] |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['view']} | {r['T']} | {' / '.join(r['plain_forms'])}; {' / '.join(r['view_forms'])} | "
              f"{100 * r['gap']:+.1f} [{100 * r['ci95'][0]:+.1f}, {100 * r['ci95'][1]:+.1f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
