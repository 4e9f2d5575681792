"""The query sets of ``bench_select.py``: LoCoMo dev banks and questions, and synthetic banks."""
from __future__ import annotations

from .. import synthetic_banks


class RealData:
    name = "locomo_dev"

    def __init__(self, path):
        import numpy as np

        from trawmem_gpu.ingest.config import BuildConfig
        from trawmem_gpu.encode import get_encoder
        from trawmem_gpu.eval.retrieval import banks_for

        bc = BuildConfig()
        convs, self.banks, _ = banks_for(path, bc, progress=False)
        items = [(c.bank_id, q.question) for c in convs for q in c.questions if q.category in (1, 2, 3, 4)]
        self.ids = [b for b, _ in items]
        self.qs = [q for _, q in items]
        self.Z = np.asarray(get_encoder(bc.encoder).encode(self.qs, is_query=True, progress=False), dtype=np.float32)
        rng = np.random.default_rng(0)
        self.perm = rng.permutation(len(self.ids))

    def queries(self, Q):
        """Q queries; beyond the distinct questions, copies get c trailing spaces (distinct texts,
        same tokens and features) so no text work is shared between copies."""
        import numpy as np

        n = len(self.ids)
        idx = [self.perm[i % n] for i in range(Q)]
        qs = [self.qs[j] + " " * (i // n) for i, j in enumerate(idx)]
        return [self.ids[j] for j in idx], qs, self.Z[np.asarray(idx)]

    def config_for_U(self, U):
        return {64: 12, 145: 26, 256: 48, 512: 100}[U]  # neighborhood_cap giving mean |U_q| ~ U


class SynData:
    name = "synthetic"

    def __init__(self, U=145, n_banks=64, seed=0, pool=4096):
        self.U = U
        thread_len = U / 12.0
        units = int(round(2 * U))  # ~24 threads: the neighbourhood (12 threads) is half the bank
        self.banks = synthetic_banks.make_banks(n_banks, units=units, thread_len=thread_len, seed=seed)
        self.pool = synthetic_banks.make_queries(self.banks, pool, seed=seed + 1)

    def queries(self, Q):
        """The first Q queries of a fixed pool (so every implementation sees the same ones)."""
        ids, qs, Z = self.pool
        return ids[:Q], qs[:Q], Z[:Q]
