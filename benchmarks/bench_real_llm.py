"""Every LLM path on a real model (issue 34), and answers with the real model as reader.

Start the model first (``bash scripts/real_llm.sh start`` prints its URL), then::

    python -m benchmarks run real_llm answers --url http://127.0.0.1:8791/v1     # 100 LoCoMo dev questions
    python -m benchmarks run real_llm paths --url URL --label after-schema         # each LLM path on the sample
    python -m benchmarks run real_llm paths --url URL --label after-json --constrain json
    python -m benchmarks run real_llm paths --url URL --label before --tree /path/to/old/tree

``answers`` (``real_llm_bench.answers``): answer F1 and judge of TrawMem and the RRF hybrid at
T = 800 on a fixed sample of 100 LoCoMo dev questions, with paired intervals; writes
``real_llm_answers.json`` (and ``.png``). ``paths`` (``real_llm_bench.paths``): each LLM path on
the bundled sample conversation, run by the code of ``--tree`` (default: this one), every request
and reply recorded (``real_llm_bench.driver``) and read back with this tree's parsers and checks
(``real_llm_bench.analyze``): wall time, calls, malformed / refused / fallback shares, and what
was produced and refused; merged under ``--label`` into ``real_llm_paths.json``. The work folder
(``--work``, default ``/tmp/trawmem-real-llm``) keeps the LLM reply caches, so a rerun resumes.
benchmarks/results/real_llm.md reads both files.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/bench_real_llm.py: run as benchmarks.bench_real_llm
    import _boot; _boot.run_file(__file__)  # noqa: E702

import argparse
from pathlib import Path

from . import harness

ROOT = Path(__file__).resolve().parents[1]


def _plot(rec: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = list(rec["paired_trawmem_minus_hybrid"])
    for k, name in enumerate(names):
        p = rec["paired_trawmem_minus_hybrid"][name]
        lo, hi = p["ci95_conversations"]
        ax.errorbar([p["mean_diff"]], [k], xerr=[[p["mean_diff"] - lo], [hi - p["mean_diff"]]], fmt="o", capsize=4)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("TrawMem minus hybrid (95% interval, conversations resampled)")
    ax.set_title(f"{rec['model']} as reader, T={rec['token_budget']}, {rec['questions']} questions", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("answers", help="answer F1 and judge, TrawMem against the hybrid at T=800")
    a.add_argument("--data", default=str(harness.dev_data("locomo")), help="LoCoMo dev file")
    a.add_argument("--n", type=int, default=100, help="questions")
    a.add_argument("--token-budget", type=int, default=800)
    p = sub.add_parser("paths", help="every LLM path on the bundled sample")
    p.add_argument("--label", required=True, help="name of this run in real_llm_paths.json (before, after-schema...)")
    p.add_argument("--constrain", choices=["schema", "json"], default="schema",
                   help="--llm-constrain of the runs (a tree without the flag ignores it)")
    p.add_argument("--only", default=None, help="comma-separated path ids to run: segment, facts, update (after "
                                                 "facts), plan-trawmem, plan-trimem (after facts), memory, eval, evolve "
                                                 "(default: all)")
    for x in (a, p):
        x.add_argument("--url", required=True, help="the model server's base URL (scripts/real_llm.sh start)")
        x.add_argument("--model", default="SmolLM2-135M-Instruct Q4_1 (llama.cpp, 1 thread)", help="for the record")
        x.add_argument("--tree", default=str(ROOT), help="the source tree whose code runs")
        x.add_argument("--work", default="/tmp/trawmem-real-llm", help="work folder: caches, banks, outputs")
    args = ap.parse_args(argv)
    if args.what == "answers":
        from .real_llm_bench.answers import main_answers

        harness.require_data(args.data)
        args.work = str(Path(args.work) / "answers")
        rec = main_answers(args)
        path = harness.save("real_llm_answers", rec, _plot(rec))
        print(f"-> {path}")
        for k, v in rec["paired_trawmem_minus_hybrid"].items():
            print(f"{k}: TrawMem {v['a_mean']} vs hybrid {v['b_mean']}: {v['mean_diff']:+.4f} "
                  f"[{v['ci95_conversations'][0]:+.4f}, {v['ci95_conversations'][1]:+.4f}] (n={v['n']})")
        return 0
    from .real_llm_bench.paths import main_paths

    rec = main_paths(args)
    with harness.locked("real_llm_paths") as old:  # paths run one at a time (--only) merge into their label
        runs = dict(old.get("runs") or {})
        prev = runs.get(args.label) or {}
        runs[args.label] = {**prev, **rec, "paths": {**(prev.get("paths") or {}), **rec["paths"]}}
        path = harness.save("real_llm_paths", {"runs": runs})
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
