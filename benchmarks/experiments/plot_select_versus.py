"""Plot ``select_versus.json`` (``bench_select.py --versus TREE``): the per-round speed ratio
(this tree / the other) by wall and by CPU time, with its median (issue 46 item 3)::

    python benchmarks/experiments/plot_select_versus.py [benchmarks/results/select_versus.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0] if argv else Path(__file__).resolve().parents[1] / "results" / "select_versus.json")
    v = json.loads(src.read_text())["versus"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key, mark in (("wall", "o"), ("cpu", "s")):
        r = v[key]["ratios"]
        ax.plot(range(1, len(r) + 1), r, mark, label=f"{key} time: median {v[key]['ratio_median']:.3f}")
        ax.axhline(v[key]["ratio_median"], lw=0.8, color=ax.lines[-1].get_color())
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_xlabel("round")
    ax.set_ylabel("queries/s: this / other")
    ax.set_title(f"CPU default, Q = {v['Q']}, {v['threads']} thread(s): "
                 f"{v['commits']['this'][:7]} vs {v['commits']['other'][:7]}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = src.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
