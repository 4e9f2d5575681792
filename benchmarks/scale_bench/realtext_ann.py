"""Issue 46 item 1's real-text check: the LoCoMo dev turns repeated to ``n`` units as one bank
(``realtext.real_turns``: read in place from the data file, built into a bank in memory, nothing
written), searched exactly and approximately at equal settings (the shipped method and query,
``ann_min_units`` forced to 1 for the approximate engine, ``None`` for the exact one, every other
``ann_*`` setting its default), the same questions: ``rounds`` LoCoMo dev questions drawn at random
(``seed``), encoded by the default encoder, asked without a date (LoCoMo gives none).

It reports what ``ann.recall_point`` reports for a synthetic bank: per-query CPU p50 / p99 of both
(a batch of one, one thread), throughput of a batch, the candidate pool's and the picks' agreement
(per query ``|A & E| / |E|``: mean, 5th percentile, min; and by original turn, :func:`text_agreement`:
a repeated turn's copies tie), the share of identical picks, the build's
and the index's seconds, the index's time per append and the peak resident memory.
The encoder reads each distinct text once through the on-disk embedding cache (``get_encoder(cache=True)``).

    python -m benchmarks run scale-query --realtext 100000      # scale_query_realtext.json
"""
from __future__ import annotations

import time
from pathlib import Path

from .. import harness


def _questions(path: Path, rounds: int, seed: int) -> list[str]:
    """``rounds`` distinct dev question texts drawn at random (all of them when fewer)."""
    import numpy as np

    from trawmem_gpu.data import load_conversations

    texts = sorted({q.question for c in load_conversations(path) for q in c.questions if q.question.strip()})
    if not texts:
        raise ValueError(f"{path} holds no questions")
    pick = np.random.default_rng(seed).permutation(len(texts))[:rounds]
    return [texts[i] for i in sorted(pick)]


def text_agreement(approx: list, exact: list, keys: list[str]) -> dict:
    """Per query ``|K(A) & K(E)| / |K(E)|`` with ``K`` the units' original turn ids (``keys``: the
    repeated bank's ids without the pass prefix ``r{p}:``): agreement up to which copy of a repeated
    turn was taken (the passes' copies have the same text and vector, so their cosines tie and
    either search may take any of them); mean, 5th percentile, min."""
    import numpy as np

    r = []
    for a, e in zip(approx, exact):
        ke = {keys[int(u)] for u in e}
        if ke:
            r.append(len({keys[int(u)] for u in a} & ke) / len(ke))
    if not r:
        return {"mean": 1.0, "p5": 1.0, "min": 1.0}
    return {"mean": float(np.mean(r)), "p5": float(np.percentile(r, 5)), "min": float(np.min(r))}


def _bank(n: int, path: Path):
    """The ``n``-turn repeated bank, its build seconds and the encoder (cached)."""
    from trawmem_gpu.data.types import Conversation
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest import build_banks

    from .realtext import real_turns

    enc = get_encoder(cache=True)
    t = time.perf_counter()
    (bank,), _ = build_banks([Conversation("big", real_turns(n, path))], encoder=enc, progress=False)
    return bank, time.perf_counter() - t, enc


def point(spec: dict) -> dict:
    """Measure the check (``spec``: ``units``, ``data`` path, ``rounds``, ``seed``, ``batch``,
    ``passes``: ``ann.exact_beside``'s)."""
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    from .ann import exact_beside
    from .query import _rss

    path, n = Path(spec["data"]), int(spec["units"])
    if n < 1:
        raise ValueError(f"units must be at least 1, got {n}")
    with harness.pin_threads(1):
        bank, build_s, enc = _bank(n, path)
        qs = _questions(path, int(spec.get("rounds", 40)) + 2, int(spec.get("seed", 7)))
        Z = np.asarray(enc.encode(qs, is_query=True), dtype=np.float32)
        ids = ["big"] * len(qs)
        t = time.perf_counter()
        ap = SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, ann_min_units=1)
        engine_s = time.perf_counter() - t
        rec, (pa, pe, ca, ce) = exact_beside(ap, ids, qs, Z, int(spec.get("batch", 64)), int(spec.get("passes", 1)))
        keys = [t.turn_id.split(":", 1)[1] for t in bank.turns]
        by_text = {"candidates": text_agreement(ca, ce, keys), "picks": text_agreement(pa, pe, keys)}
    rec["settings"].update(encoder=enc.id, dim=int(Z.shape[1]))
    return {"spec": spec, "units": bank.n_units, "threads": bank.n_threads, "questions": len(qs) - 2,
            "build_s": build_s, "engine_s": engine_s, **rec, "agreement_by_text": by_text, **_rss()}


if __name__ == "__main__":  # a child process: the check
    from .query import child_main

    child_main(point, "benchmarks.scale_bench.realtext_ann", "scale-query --realtext N")
