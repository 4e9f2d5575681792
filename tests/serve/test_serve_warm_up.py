"""The server's warm-up (``serve.service.warm_up``) builds the approximate index of every bank
searched over a shortlist before the first request, not only the first bank's by its one query:
otherwise a large bank's first request pays for its index (seconds at 10^6 units)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("faiss")

from benchmarks.synthetic_banks import make_banks, make_queries  # noqa: E402
from trawmem_gpu.memory.engines import ServedEngine  # noqa: E402
from trawmem_gpu.select.config import SelectConfig  # noqa: E402
from trawmem_gpu.select.engine import SelectionEngine  # noqa: E402
from trawmem_gpu.select.params import QueryParams  # noqa: E402
from trawmem_gpu.serve.service import warm_up  # noqa: E402


class _Encoder:
    """Unit vectors of the banks' width, one per text (deterministic)."""

    def __init__(self, d: int):
        self.d = d

    def encode(self, texts, is_query=False):
        z = np.random.default_rng(len(texts)).standard_normal((len(texts), self.d)).astype(np.float32)
        return z / np.linalg.norm(z, axis=1, keepdims=True)


def _service(banks):
    make = lambda bs, cfg: SelectionEngine(bs, cfg, device="cpu", threads=1, ann_min_units=1000)  # noqa: E731
    engines = ServedEngine({b.bank_id: b for b in banks}, SelectConfig(), make)
    return SimpleNamespace(encoder=_Encoder(32), engines=engines, defaults=QueryParams())


def test_warm_up_builds_every_large_banks_index_and_picks_the_same():
    small = make_banks(1, units=600, thread_len=6.0, d=32, seed=42, prefix="ssml")[0]
    big = make_banks(1, units=3000, thread_len=6.0, d=32, seed=41, prefix="sbig")[0]
    warm, cold = _service([small, big]), _service([small, big])  # the warm-up's one query goes to `small`
    key = ("unit_index", warm.engines.engine.plan.ann_kind)
    info = warm.engines.engine.snapshot.infos[1]
    assert info.bank is big and key not in info.cache
    assert warm_up(warm) == [big.bank_id]
    index = info.cache[key]
    ids, qs, Z = make_queries([big], 6, seed=43)
    assert warm.engines.engine.select_units(ids, qs, Z) == cold.engines.engine.select_units(ids, qs, Z)
    assert info.cache[key] is index  # the queries used the index built at warm-up


def test_no_large_bank_nothing_to_build():
    small = make_banks(1, units=600, thread_len=6.0, d=32, seed=42, prefix="ssml")[0]
    assert warm_up(_service([small])) == []
