"""An import that carries vectors (``trawmem export --vectors``) against one that encodes the texts
again, side by side, on one bank of N synthetic turns with the default encoder.

    python -m benchmarks.bench_import_vectors [--sizes 500 2000] [--rounds 3]

Per N: the bank is built once, exported with and without vectors; then, per round, each file is
imported into a fresh collection (the two alternate). Writes ``benchmarks/results/import_vectors.json``
and ``import_vectors.png``: the median seconds of each import, their ratio, and the two files' sizes.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
WORDS = "garden violin train bakery bicycle dog lisbon tomato job wheel vet lesson".split()


def _turns(n: int) -> list[dict]:
    return [{"turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben",
             "text": f"Turn {i} on the {WORDS[i % len(WORDS)]} and the {WORDS[(i // 5) % len(WORDS)]}.",
             "timestamp": f"2030-01-{1 + i // 400:02d}T{9 + (i % 400) // 60:02d}:{i % 60:02d}:00"} for i in range(n)]


def run(sizes, rounds: int) -> dict:
    from trawmem_gpu import Memory

    rows, enc_id = [], None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in sizes:
            src = Memory(tmp / f"src{n}")
            enc_id = src.encoder_id
            src.add("b", _turns(n))
            files = {"vectors": tmp / f"v{n}.jsonl", "texts": tmp / f"t{n}.jsonl"}
            src.export(files["vectors"], vectors=True)
            src.export(files["texts"])
            secs = {k: [] for k in files}
            for r in range(rounds):
                for k, f in files.items():
                    dst = Memory(tmp / f"dst{n}-{k}-{r}")
                    t0 = time.perf_counter()
                    dst.import_(f)
                    secs[k].append(time.perf_counter() - t0)
            v, t = statistics.median(secs["vectors"]), statistics.median(secs["texts"])
            rows.append({"n_turns": n, "rounds": rounds, "with_vectors_s": v, "encoding_s": t, "ratio": t / v,
                         "bytes_with_vectors": files["vectors"].stat().st_size,
                         "bytes_without": files["texts"].stat().st_size, "all_s": secs})
            print({k: x for k, x in rows[-1].items() if k != "all_s"}, flush=True)
    return {"encoder": enc_id, "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = run(a.sizes, a.rounds)
    out["wall_s"] = time.perf_counter() - t0
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "import_vectors.json").write_text(json.dumps(out, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n_turns"] for r in out["rows"]]
    plt.plot(ns, [r["encoding_s"] for r in out["rows"]], "o-", label="import, texts encoded")
    plt.plot(ns, [r["with_vectors_s"] for r in out["rows"]], "o-", label="import with --vectors")
    plt.xlabel("turns in the bank")
    plt.ylabel("seconds (median)")
    plt.legend()
    plt.savefig(RESULTS / "import_vectors.png", dpi=100)


if __name__ == "__main__":
    main()
