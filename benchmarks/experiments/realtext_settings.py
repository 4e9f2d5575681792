"""The real-text check of issue 46 (the LoCoMo dev turns repeated to ``--units`` turns, one bank,
``scale_bench.realtext_ann``) at several approximate-search settings side by side in one process:
the bank and the questions built once, then per setting an engine searched approximately beside
the same tables searched exactly (``scale_bench.ann.exact_beside``): p50 / p99, the candidate
pool's and the picks' agreement ``|A & E| / |E|`` (mean, 5th percentile, min), and the same up to
which copy of a repeated turn was taken.

    python -m benchmarks.experiments.realtext_settings --settings 128:16,128:64,512:16 [--units 100000]

A setting is ``SHORTLIST:NPROBE`` (``EngineConfig.ann_shortlist`` / ``ann_nprobe``), or
``SHORTLIST:NPROBE:VECTORS`` with the index's vector storage (``EngineConfig.vectors``: float32,
float16, int8, pq; ``store/vectors.py``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .. import harness


def _settings(s: str) -> list[dict]:
    from trawmem_gpu.store.vectors import VECTOR_KINDS

    out = []
    for part in s.split(","):
        fields = part.split(":")
        try:
            m, p = (int(x) for x in fields[:2])
            if len(fields) not in (2, 3):
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"a setting is SHORTLIST:NPROBE[:VECTORS], got {part!r}") from None
        if m < 1 or p < 1:
            raise argparse.ArgumentTypeError(f"SHORTLIST and NPROBE must be at least 1, got {part!r}")
        if len(fields) == 3 and fields[2] not in VECTOR_KINDS:
            raise argparse.ArgumentTypeError(f"VECTORS is one of {', '.join(VECTOR_KINDS)}, got {fields[2]!r}")
        out.append({"ann_shortlist": m, "ann_nprobe": p, **({"vectors": fields[2]} if len(fields) == 3 else {})})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", type=_settings, default=_settings("128:16,128:64"))
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=40, help="questions per setting")
    ap.add_argument("--data", default=None, help="the LoCoMo dev file (default: the harness's dev data)")
    ap.add_argument("--name", default="realtext_settings")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    from ..scale_bench.ann import exact_beside
    from ..scale_bench.realtext_ann import _bank, _questions, text_agreement

    path = harness.require_data(a.data or harness.dev_data("locomo"))
    rows = []
    with harness.pin_threads(1):
        bank, build_s, enc = _bank(a.units, path)
        qs = _questions(path, a.rounds + 2, 7)
        Z = np.asarray(enc.encode(qs, is_query=True), dtype=np.float32)
        ids = ["big"] * len(qs)
        keys = [t.turn_id.split(":", 1)[1] for t in bank.turns]
        for kw in a.settings:
            eng = SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, ann_min_units=1, **kw)
            rec, (pa, pe, ca, ce) = exact_beside(eng, ids, qs, Z, 64)
            rec["agreement_by_text"] = {"candidates": text_agreement(ca, ce, keys), "picks": text_agreement(pa, pe, keys)}
            rows.append({"setting": kw, **rec})
            print(f"{kw}: exact {rec['exact_ms']:.2f} ms, approx {rec['approx_ms']:.2f} / {rec['approx_p99_ms']:.2f} ms, "
                  f"pool {rec['candidate_recall']['mean']:.4f}, picks {rec['pick_recall']['mean']:.4f}", flush=True)
            del eng
    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    rec = {"units": bank.n_units, "threads": bank.n_threads, "questions": a.rounds, "build_s": build_s,
           "encoder": enc.id, "rows": rows, "loadavg": load}
    print(harness.save(a.name, rec, out_dir=a.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
