"""Two versions of the code read side by side over fresh processes: ``scale-query``'s 10^6-unit point
(issue 46 item 1) run in each version's own checkout, the versions alternating pair after pair
(``A B``, ``B A``, ...), so a slow stretch of the shared host falls on both.

    python -m benchmarks.experiments.paired_processes run OLD_DIR NEW_DIR PAIRS NAME
    python -m benchmarks.experiments.paired_processes summary OLD_DIR NEW_DIR NAME

``OLD_DIR`` / ``NEW_DIR`` are checkouts of the two commits (``git worktree add DIR COMMIT``); each
process runs ``python -m benchmarks run scale-query --only ann --ann-sizes 1000000x384 --rounds
40 --bank-cache $CACHE --passes 3 --processes 1 --name NAME_<arm>_<pair>`` with the checkout as its
working directory, so it imports that version's package and writes its JSON under that
checkout's ``benchmarks/results``. ``CACHE`` (default ``/work/scratch``) holds the cached bank.
Each process builds its own index (about 2 minutes at 10^6) and takes 5-7 minutes in all.

``summary`` gathers the runs into ``benchmarks/results/NAME.json`` and ``NAME.png`` (here): per
process p50 / p99 (CPU ms per query, one thread, medians over 3 passes of 40 queries), exact
search's p50, agreement, throughput, peak RSS and the index update per append, and per pair the
old p50 minus the new one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ARMS = ("old", "new")


def _command(name: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks", "run", "scale-query", "--only", "ann", "--ann-sizes", "1000000x384",
            "--rounds", "40", "--bank-cache", os.environ.get("CACHE", "/work/scratch"), "--passes", "3",
            "--processes", "1", "--name", name]


def run(dirs: dict, pairs: int, name: str) -> None:
    """``pairs`` pairs of fresh processes, the arms' order alternating per pair."""
    for i in range(1, pairs + 1):
        for arm in (ARMS if i % 2 else ARMS[::-1]):
            print(f"pair {i} {arm} load {os.getloadavg()[0]:.2f}", flush=True)
            done = subprocess.run(_command(f"{name}_{arm}_{i}"), cwd=dirs[arm], stdout=subprocess.DEVNULL)
            if done.returncode != 0:
                raise SystemExit(f"pair {i}, {arm} ({dirs[arm]}): scale-query exited with {done.returncode}")


def _point(path: Path) -> dict:
    d = json.loads(path.read_text())["ann"][0]
    return dict(p50=round(d["approx_ms"], 3), p99=round(d["approx_p99_ms"], 2),
                passes=[round(x, 3) for x in d["approx_pass_ms"]], exact_p50=round(d["exact_ms"], 1),
                pool=round(d["candidate_recall"]["mean"], 4), picks=round(d["pick_recall"]["mean"], 4),
                same=d["same_picks"], qps={k: round(v, 2) for k, v in d["qps"].items()},
                peak_rss_mib=round(d["vmhwm_mib"]), append_ms={k: round(v, 3) for k, v in d["index_append_ms"].items()},
                engine_s=round(d["engine_s"], 1))


def summary(dirs: dict, name: str, out_dir: Path | None = None) -> dict:
    """The runs of both arms gathered, with the per-pair differences (see the module docstring),
    written to ``out_dir`` (default: this project's ``benchmarks/results``)."""
    got = {}
    for arm in ARMS:
        res = Path(dirs[arm]) / "benchmarks" / "results"
        got[arm] = {int(p.stem.rsplit("_", 1)[1]): _point(p) for p in res.glob(f"{name}_{arm}_*.json")}
    pairs = sorted(set(got["old"]) & set(got["new"]))
    if not pairs:
        raise SystemExit(f"no complete pair of {name}_old_N / {name}_new_N runs")
    diff = [round(got["old"][i]["p50"] - got["new"][i]["p50"], 3) for i in pairs]
    commits = {arm: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=dirs[arm], capture_output=True,
                                   text=True).stdout.strip() for arm in ARMS}
    out = dict(what="scale-query's 10^6 x 384 point over fresh processes, two versions alternating pair by pair",
               command=" ".join(["python -m benchmarks.experiments.paired_processes run OLD NEW PAIRS", name]),
               each=" ".join(_command(f"{name}_ARM_PAIR")[1:]), commits=commits, pairs=pairs,
               arms={arm: dict(runs=[got[arm][i] for i in pairs],
                               p50_median=round(float(np.median([got[arm][i]["p50"] for i in pairs])), 3),
                               p99_median=round(float(np.median([got[arm][i]["p99"] for i in pairs])), 2))
                     for arm in ARMS},
               old_minus_new_p50=diff, old_minus_new_median=round(float(np.median(diff)), 3),
               new_lower_in=f"{sum(d > 0 for d in diff)} of {len(diff)} pairs")
    here = Path(out_dir) if out_dir is not None else Path(__file__).resolve().parents[1] / "results"
    if (here / f"{name}.json").exists():  # a note written by hand on an earlier summary is kept
        note = json.loads((here / f"{name}.json").read_text()).get("note")
        out.update({"note": note} if note else {})
    (here / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    _plot(out, here / f"{name}.png")
    return out


def _plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm, mark in zip(ARMS, ("o", "s")):
        ax.plot(out["pairs"], [r["p50"] for r in out["arms"][arm]["runs"]], mark + "-",
                label=f"{arm} ({out['commits'][arm]}): median {out['arms'][arm]['p50_median']} ms")
    ax.axhline(5.0, color="grey", ls="--", lw=1, label="item 1's p50 target")
    ax.set_xticks(out["pairs"])
    ax.set_xlabel("pair (fresh processes, order alternating)")
    ax.set_ylabel("p50 CPU ms per query, one thread")
    ax.set_title("10^6 units, d = 384: approximate select")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) < 5 or sys.argv[1] not in ("run", "summary"):
        raise SystemExit(__doc__)
    dirs = {"old": sys.argv[2], "new": sys.argv[3]}
    for arm, d in dirs.items():
        if not (Path(d) / "benchmarks").is_dir():
            raise SystemExit(f"{arm}: {d} is not a checkout of this project")
    name = sys.argv[4]
    if sys.argv[1] == "run":
        if len(sys.argv) != 6 or not sys.argv[4].isdigit():
            raise SystemExit(__doc__)
        name = sys.argv[5]
        run(dirs, int(sys.argv[4]), name)
    print(json.dumps(summary(dirs, name), indent=1))


if __name__ == "__main__":
    main()
