"""The tables of ``benchmarks/results/real_llm.md`` from ``real_llm_paths.json`` and
``real_llm_answers.json``, as markdown on stdout::

    python -m benchmarks.real_llm_bench.report
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
STRUCTURED = ("segment", "head", "extract", "profile", "profile_update", "key_info", "target_query", "follow_up",
              "judge", "critique", "apply")


def _pct(n, d) -> str:
    return "-" if not d else f"{n}/{d} ({100 * n / d:.0f}%)"


def paths_table(runs: dict) -> str:
    """Per path and run: outcome, seconds, requests, malformed / refused / cut shares."""
    rows = ["| path | run | rc | wall s | requests | malformed | refused (checks) | cut at limit | failed |",
            "|---|---|---|---|---|---|---|---|---|"]
    names = list(dict.fromkeys(n for r in runs.values() for n in r["paths"]))
    for name in names:
        for label, r in runs.items():
            p = r["paths"].get(name)
            if p is None:
                continue
            k = p["kinds"].values()
            req = sum(x.get("requests", 0) for x in k)
            rep = sum(x.get("replies", 0) for x in k)
            srep = sum(x.get("replies", 0) for n, x in p["kinds"].items() if n in STRUCTURED)
            mal = sum(x.get("malformed", 0) for n, x in p["kinds"].items() if n in STRUCTURED)
            ref = sum(x.get("refused", 0) for x in k)
            cut = sum(x.get("cut", 0) for x in k)
            fail = sum(x.get("failed", 0) for x in k)
            rows.append(f"| {name} | {label} | {p['rc']} | {p['seconds']:.0f} | {req} | {_pct(mal, srep)} | "
                        f"{_pct(ref, rep)} | {cut} | {fail} |")
    return "\n".join(rows)


def kinds_table(runs: dict) -> str:
    """Malformed share of the structured replies per kind of call, per run (constrained or not)."""
    labels = list(runs)
    kinds = [k for k in STRUCTURED if any(k in p["kinds"] for r in runs.values() for p in r["paths"].values())]
    rows = ["| call | " + " | ".join(f"malformed, {lb}" for lb in labels) + " |",
            "|---|" + "---|" * len(labels)]
    for kind in kinds:
        cells = []
        for lb in labels:
            n = sum(p["kinds"].get(kind, {}).get("malformed", 0) for p in runs[lb]["paths"].values())
            d = sum(p["kinds"].get(kind, {}).get("replies", 0) for p in runs[lb]["paths"].values())
            cells.append(_pct(n, d))
        rows.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def answers_table(rec: dict) -> str:
    rows = ["| method | answer F1 | judge | answers refused | answer / judge failures | LLM s |", "|---|---|---|---|---|---|"]
    for m, s in rec["methods"].items():
        c = s.get("counts") or {}
        rows.append(f"| {m} | {s['mean']['f1_locomo']:.3f} | {s['mean']['judge']:.3f} | {c.get('answer_refused', 0)} | "
                    f"{c.get('answer_errors', 0)} / {c.get('judge_errors', 0)} | "
                    f"{(s.get('llm_work') or {}).get('seconds', 0):.0f} |")
    for k, v in rec["paired_trawmem_minus_hybrid"].items():
        rows.append(f"\nPaired, TrawMem minus hybrid, {k}: {v['mean_diff']:+.3f}, 95% interval "
                    f"[{v['ci95_conversations'][0]:+.3f}, {v['ci95_conversations'][1]:+.3f}] resampling the "
                    f"{v['conversations']} conversations, [{v['ci95_questions'][0]:+.3f}, {v['ci95_questions'][1]:+.3f}] "
                    f"resampling the {v['n']} questions.")
    return "\n".join(rows)


def main() -> int:
    out = []
    p = RESULTS / "real_llm_paths.json"
    if p.exists():
        runs = json.loads(p.read_text())["runs"]
        out += ["## Paths", paths_table(runs), "", "## Malformed replies by call", kinds_table(runs)]
    a = RESULTS / "real_llm_answers.json"
    if a.exists():
        out += ["", "## Answers", answers_table(json.loads(a.read_text()))]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
