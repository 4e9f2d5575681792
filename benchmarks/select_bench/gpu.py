"""The GPU target: the engine on CUDA at U ~ 145, B = 16, d = 384 and large Q."""
from __future__ import annotations

import importlib.util
import os
import time

from .. import synthetic_banks

from .impls import run_batched

HBM_BYTES_PER_S = 4.3e12  # H200

def gpu_target(args) -> dict:
    import torch

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.steps.seeds import faiss_available, faiss_gpus

    dev = args.gpu_device
    out = {"target": "U=145, B=16, d=384", "hbm_bytes_per_s": HBM_BYTES_PER_S, "cuda": torch.cuda.is_available(),
           "faiss": faiss_available(), "faiss_gpus": faiss_gpus(), "device_arg": dev}
    if dev == "cuda" and not torch.cuda.is_available():
        out["skipped"] = "no CUDA device: the GPU benchmark did not run"
        print("  gpu target: skipped (no CUDA)")
        return out
    out["device"] = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (smoke run of the GPU benchmark code)"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    banks = synthetic_banks.make_banks(256, units=290, thread_len=145 / 12, seed=11)
    lexical_ok = all(importlib.util.find_spec(m) is not None for m in ("bm25s", "Stemmer"))  # BM25: select/lexical.py
    cfg = SelectConfig() if lexical_ok else SelectConfig(affinity="dense")
    params = QueryParams(budget=16)
    out["config"] = {"affinity": cfg.affinity, "budget": params.budget, "hops": params.hops,
                     "note": None if lexical_ok else "bm25s/PyStemmer missing: dense affinity (no BM25) instead of rrf"}
    # chunks as large as memory allows: [Qc, U, U] float32 temporaries of ~2 GB
    chunk = int(os.environ.get("GPU_CHUNK_ELEMS", 1 << 29))
    out["chunk_elems"] = chunk
    runs = []
    for impl in ("triton", "torch"):
        try:
            eng = SelectionEngine(banks, cfg, device=dev, kernels=impl if dev == "cuda" else "torch",
                                  chunk_elems=chunk)
        except Exception as e:  # noqa: BLE001
            runs.append({"impl": impl, "error": repr(e)})
            continue
        for Q in args.gpu_q:
            ids, qs, Z = synthetic_banks.make_queries(banks, Q, seed=5)
            try:
                r = run_batched(eng, ids, qs, Z, reps=3, params=params)
            except torch.cuda.OutOfMemoryError as e:
                runs.append({"impl": impl, "Q": Q, "error": f"OOM: {e}"[:200]})
                torch.cuda.empty_cache()
                continue
            except Exception as e:  # noqa: BLE001 - report, keep going
                runs.append({"impl": impl, "Q": Q, "error": repr(e)[:300]})
                continue
            st = r["stage_us_per_query"]
            total = sum(st.values())
            device_us = total - st.get("text", 0.0) - st.get("output", 0.0)
            cs = eng.candidate_sets(ids[:512], qs[:512], Z[:512], params=params)
            U = sum(len(c) for c in cs) / len(cs)
            N = sum(b.n_units for b in banks) / len(banks)
            J = sum(b.n_threads for b in banks) / len(banks)
            # bytes a selection must move at least: the bank's unit vectors for affinity (N d 4),
            # the candidates' K (U^2 4), bridge rows (U T 4) and per-unit state (~16 floats)
            bytes_q = N * 384 * 4 + U * U * 4 + U * 12 * 4 + U * 16 * 4 + J * 8
            sel_s = 1e6 / device_us if device_us > 0 else float("nan")
            runs.append({"impl": impl, "Q": Q, "U_mean": U, "end_to_end_qps": r["qps"],
                         "device_selections_per_s": sel_s, "stage_us_per_query": st,
                         "bytes_per_selection_model": bytes_q,
                         "bandwidth_fraction": bytes_q * sel_s / HBM_BYTES_PER_S, "p50_ms": r["p50_ms"]})
            print(f"  gpu {impl} Q={Q}: end-to-end {r['qps']:,.0f} q/s, device stages {sel_s:,.0f} selections/s, "
                  f"{bytes_q * sel_s / HBM_BYTES_PER_S:.1%} of {HBM_BYTES_PER_S / 1e12:.1f} TB/s", flush=True)
        del eng
        if dev == "cuda":
            torch.cuda.empty_cache()
    out["runs"] = runs
    out["seed_search"] = _seed_search(banks[:64], cfg, dev, chunk, sync)
    return out


def _seed_search(banks, cfg, dev: str, chunk: int, sync) -> dict:
    """Seed search on the device: exact per-bank top-24 heads of 4,096 queries, torch against faiss
    (a GPU index if any), and whether both find the same heads."""
    import numpy as np
    import torch

    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.steps.seeds import faiss_available

    try:
        from trawmem_gpu.select.engine.batch import make_batch
        from trawmem_gpu.select.steps.seeds import HeadIndex

        eng = SelectionEngine(banks, cfg, device=dev, chunk_elems=chunk)
        ids, qs, Z = synthetic_banks.make_queries(banks, 4096, seed=6)
        qb = make_batch(eng.snapshot, ids, qs, Z, None, eng.device, eng.dtype)
        bidx, Zt = torch.as_tensor(qb.bidx, device=dev), qb.Z
        heads = torch.as_tensor(np.concatenate([b.head_vecs for b in banks]), dtype=eng.dtype, device=dev)
        counts = torch.as_tensor([b.n_threads for b in banks], device=dev)
        idx = HeadIndex(heads, torch.cumsum(counts, 0) - counts, counts, mode="torch")
        seed = {}
        for mode in ("torch", "faiss"):
            if mode == "faiss" and not faiss_available():
                seed[mode] = "skipped: faiss not installed"
                continue
            idx.search(Zt, bidx, 24, mode=mode)
            sync()
            t = time.perf_counter()
            r = idx.search(Zt, bidx, 24, mode=mode)
            sync()
            seed[mode] = {"ms": (time.perf_counter() - t) * 1e3, "faiss_gpu": idx._faiss_gpu,
                          "fallback_queries": idx.stats.fallback_queries}
            seed.setdefault("_ids", []).append(r[1])
        ids_l = seed.pop("_ids", [])
        if len(ids_l) == 2:
            seed["same_ids"] = bool(torch.equal(ids_l[0], ids_l[1]))
        print(f"  gpu seed search ({len(banks)} banks, Q=4096, k=24): {seed}", flush=True)
        return seed
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)[:300]}
