"""The burst-vector diagnostic's table (issue 36): ``transfer.json`` of runs of the transfer bench
that differ only in ``TRAWMEM_BENCH_UNIT_VECS`` (``unit_vecs``), joined into one JSON and one
markdown table.

    python -m benchmarks.transfer_bench.vecs_table OUT.json NAME=RUN.json[:VIEW=FORM,...] ...

Each ``NAME=RUN.json:VIEW=FORM,...`` is one run and the forms it set (a view not named: ``mean``).
Per set and T: TrawMem's and the hybrid's macro recall under each form measured on the set, the
fair hybrid (the stronger form on the set by mean recall over the T's, its messages units
included), TrawMem's margin over it, and that margin minus plain's (under the shipped form).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def cells(runs: dict) -> dict:
    """``{(set, T): {form: {"trawmem", "hybrid", "same_form_margin"}}}`` over every run (a set's
    form is the run's for the set's view; runs that agree on a set's form must agree on it)."""
    out: dict = {}
    for run in runs.values():
        res, forms = run["result"], run["forms"]
        hyb = res["hybrid"]
        for r in res["table"]:
            if r["variant"] != "defaults":
                continue
            form = forms.get(r["set"].split("/")[1], "mean")
            by = hyb[r["set"]]["by_units"]
            c = {"trawmem": r["recall"], "hybrid": by["bursts"][str(r["T"])]["recall"],
                 "hybrid_messages": by["messages"][str(r["T"])]["recall"] if "messages" in by else None,
                 "same_form": {"units": r["hybrid_units"], **r["vs_hybrid"]}}
            out.setdefault((r["set"], r["T"]), {}).setdefault(form, c)
    return out


def fair(got: dict, label: str, Ts: list) -> tuple[str, dict]:
    """The stronger hybrid on ``label``: ``(form or "messages", {T: recall})``."""
    opts: dict = {}
    for form in got[(label, Ts[0])]:
        opts[form] = {T: got[(label, T)][form]["hybrid"] for T in Ts}
        if got[(label, Ts[0])][form]["hybrid_messages"] is not None:
            opts["messages"] = {T: got[(label, T)][form]["hybrid_messages"] for T in Ts}
    best = max(opts, key=lambda k: (np.mean(list(opts[k].values())), k == "mean"))
    return best, opts[best]


def table(runs: dict) -> list[dict]:
    got = cells(runs)
    Ts = sorted({T for _, T in got})
    labels = list(dict.fromkeys(s for s, _ in got))
    fairs = {s: fair(got, s, Ts) for s in labels}
    plain = next(s for s in labels if s.endswith("/plain"))
    rows = []
    for s in labels:
        for form in got[(s, Ts[0])]:
            for T in Ts:
                c, (fform, frec) = got[(s, T)][form], fairs[s]
                base = got[(plain, T)]["mean"]["trawmem"] - fairs[plain][1][T]
                m = c["trawmem"] - frec[T]
                rows.append({"set": s, "T": T, "vectors": form, "trawmem": c["trawmem"], "hybrid": c["hybrid"],
                             "fair_hybrid": frec[T], "fair_hybrid_vectors": fform, "margin_fair": m,
                             "gap_to_plain": m - base, "same_form": c["same_form"]})
    return rows


def markdown(rows: list[dict]) -> str:
    L = ["| set | T | vectors | TrawMem | hybrid (same vectors) | fair hybrid (its vectors) | margin vs fair | "
         "gap to plain | margin vs same-vector hybrid [95%] |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sf = r["same_form"]
        L.append(f"| {r['set']} | {r['T']} | {r['vectors']} | {r['trawmem']:.3f} | {r['hybrid']:.3f} | "
                 f"{r['fair_hybrid']:.3f} ({r['fair_hybrid_vectors']}) | {100 * r['margin_fair']:+.1f} | "
                 f"{100 * r['gap_to_plain']:+.1f} | {100 * sf['margin']:+.1f} [{100 * sf['ci95'][0]:+.1f}, "
                 f"{100 * sf['ci95'][1]:+.1f}] |")
    return "\n".join(L) + "\n"


def main(argv: list[str]) -> int:
    out, runs = Path(argv[0]), {}
    for arg in argv[1:]:
        name, _, rest = arg.partition("=")
        path, _, spec = rest.partition(":")
        forms = dict(p.split("=", 1) for p in spec.split(",") if p)
        runs[name] = {"forms": forms, "result": json.loads(Path(path).read_text())}
    rows = table(runs)
    out.write_text(json.dumps({"about": __doc__, "rows": rows, "runs": runs}, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
