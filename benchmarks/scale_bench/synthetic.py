"""Collections of synthetic banks on disk (``benchmarks/synthetic_banks.py``'s banks, 100 units each
by default), written in blocks so that 10^5 banks never sit in memory at once, and the stand-in
encoder their queries need (the banks' encoder id; queries come with their vectors)."""
from __future__ import annotations

import time
from pathlib import Path


def make_collection(path: Path, n_banks: int, units: int = 100, block: int = 2000, seed: int = 0, log=None) -> dict:
    """Write ``n_banks`` synthetic banks into a new collection at ``path`` (one ``put_many`` per
    block); returns the seconds and bytes on disk."""
    from trawmem_gpu.store import Collection

    from ..synthetic_banks import make_banks

    coll = Collection(path, create=True)
    t0 = time.perf_counter()
    for s in range(0, n_banks, block):
        banks = make_banks(min(block, n_banks - s), units=units, seed=seed + s, prefix=f"b{s // block:03d}-")
        coll.put_many(banks, group=block)
        if log:
            log(f"    {s + len(banks)}/{n_banks} banks written")
    secs = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return {"banks": n_banks, "units_per_bank": units, "write_s": round(secs, 1), "disk_bytes": size}


def query_set(path: Path, bank_ids: list[str], seed: int = 1):
    """``(questions, vectors)`` near a unit of each of ``bank_ids`` (loaded one at a time)."""
    import numpy as np

    from trawmem_gpu.store import Collection

    from ..synthetic_banks import make_queries

    coll = Collection(path)
    qs, zs = [], []
    for i, b in enumerate(bank_ids):
        _, q, z = make_queries([coll.load(b)], 1, seed=seed + i)
        qs.append(q[0])
        zs.append(z[0])
    return qs, np.asarray(zs, dtype=np.float32)


def stand_in_encoder():
    """An encoder with the synthetic banks' id and width (``synthetic-384``): queries bring vectors,
    so it never encodes a question; a call would get a fixed vector."""
    import numpy as np

    from trawmem_gpu.encode.base import Encoder

    class SyntheticIds(Encoder):
        id, dim = "synthetic-384", 384

        def _encode_batch(self, texts, is_query):
            return np.ones((len(texts), self.dim), dtype=np.float32)

    return SyntheticIds()


def rss_mb() -> dict:
    """This process's resident memory now and at its peak (``/proc/self/status``), in MB."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                k, v = line.split(":")
                out[k] = round(int(v.split()[0]) / 1024, 1)
    except OSError:
        pass
    return out
