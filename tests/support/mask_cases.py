"""The unit masks and the reference's masked picks that the mask agreement suites share
(``select/agreement/test_masks.py``, ``test_masks_scale.py``)."""
from __future__ import annotations

import numpy as np

from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.reference import select_reference


def unit_masks(banks, ids, seed: int) -> list:
    """One mask per query: densities 0.2 .. 0.9, a mask that keeps one unit, one that keeps none,
    none at all (no filter) and one that keeps every unit."""
    rng = np.random.default_rng(seed)
    n = {b.bank_id: b.n_units for b in banks}
    out = []
    for i, b in enumerate(ids):
        kind = i % 7
        if kind == 4:
            out.append(None)
        elif kind == 5:
            out.append(np.ones(n[b], dtype=bool))
        elif kind == 6:
            m = np.zeros(n[b], dtype=bool)
            m[rng.integers(n[b])] = True
            out.append(m if i % 2 else np.zeros(n[b], dtype=bool))
        else:
            out.append(rng.random(n[b]) < (0.2, 0.45, 0.7, 0.9)[kind])
    return out


def masked_reference(banks, cfg, ids, qs, Z, qp, masks) -> list[list[int]]:
    """The reference's picks of each query over its bank restricted to its mask (``keep=``)."""
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return [select_reference(ctx[b], q, z, cfg, qp, keep=m).units for b, q, z, m in zip(ids, qs, Z, masks)]
