"""The real-text check (``realtext_settings``: the LoCoMo dev turns repeated to ``--units`` turns, one
bank, MiniLM vectors) with the BM25 reading switched between arms in one process, interleaved:
``lexical_shortlist.MERGED`` off (``lexical_dense`` past ``EXACT_POSTINGS``, ``bm25_sparse`` below)
and on (``lexical_merge`` for every query). Per arm: p50 / p99, pool and picks against exact (the
same BM25 either way, so the same agreement is expected), and how many questions took each reading.

    python -m benchmarks.experiments.realtext_bm25 --data .../locomo_dev.json [--units 100000] [--rounds 40] [--arms 4]
"""
from __future__ import annotations

import argparse

from .. import harness


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=40, help="questions per arm")
    ap.add_argument("--arms", type=int, default=4, help="rows, alternating MERGED off / on")
    ap.add_argument("--shortlist", type=int, default=128)
    ap.add_argument("--nprobe", type=int, default=32)
    ap.add_argument("--data", default=None, help="the LoCoMo dev file (default: the harness's dev data)")
    ap.add_argument("--name", default="realtext_bm25")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, lexical_shortlist as lx

    from ..scale_bench.ann import exact_beside
    from ..scale_bench.realtext_ann import _bank, _questions, text_agreement

    path = harness.require_data(a.data or harness.dev_data("locomo"))
    seen = {"compiled": 0, "sparse": 0}
    orig, plain, calls = lx.lexical, lx.bm25_sparse, [0]

    def sparse(*args):
        calls[0] += 1
        return plain(*args)

    def counted(snap, bank, cols, M, rows, keep=None):
        before = calls[0]
        out = orig(snap, bank, cols, M, rows, keep)
        seen["sparse" if calls[0] > before else "compiled"] += 1  # bm25_sparse ran, or the compiled reading
        return out

    lx.bm25_sparse = sparse
    lx.lexical = counted
    from trawmem_gpu.select.engine import shortlist as sl
    sl.lexical = counted
    rows = []
    with harness.pin_threads(1):
        bank, build_s, enc = _bank(a.units, path)
        qs = _questions(path, a.rounds + 2, 7)
        Z = np.asarray(enc.encode(qs, is_query=True), dtype=np.float32)
        ids = ["big"] * len(qs)
        keys = [t.turn_id.split(":", 1)[1] for t in bank.turns]
        for i in range(a.arms):
            lx.MERGED = bool(i % 2)
            seen.update(compiled=0, sparse=0)
            eng = SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, ann_min_units=1,
                                  ann_shortlist=a.shortlist, ann_nprobe=a.nprobe)
            rec, (pa, pe, ca, ce) = exact_beside(eng, ids, qs, Z, 64)
            rec["agreement_by_text"] = {"candidates": text_agreement(ca, ce, keys), "picks": text_agreement(pa, pe, keys)}
            rows.append({"merged": lx.MERGED, "readings": dict(seen), **rec})
            print(f"MERGED={lx.MERGED}: approx {rec['approx_ms']:.2f} / {rec['approx_p99_ms']:.2f} ms, exact "
                  f"{rec['exact_ms']:.2f}, pool {rec['candidate_recall']['mean']:.4f}, picks "
                  f"{rec['pick_recall']['mean']:.4f}, readings {seen}", flush=True)
            del eng
    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    rec = {"units": bank.n_units, "threads": bank.n_threads, "questions": a.rounds, "build_s": build_s,
           "encoder": enc.id, "rows": rows, "loadavg": load}
    print(harness.save(a.name, rec, out_dir=a.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
