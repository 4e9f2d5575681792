"""A pass over more turns (texts) than a process-wide text cache holds reads them without it
(``workspace.TEXT_SCAN_CACHED``: ``unit_line`` / ``date_label`` in ``token_costs``;
``text_features.TEMPORAL_CACHED``: ``_temporal`` in ``temporal_flags``): an LRU cache filled in
order by more keys than it holds hits nothing on the next such pass, and only kept the last turns
and texts alive (issue 46 item 2). The values are the cached pass's, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select import text_features, workspace
from trawmem_gpu.select.text_features import temporal_flags
from trawmem_gpu.select.workspace import token_costs

from benchmarks.synthetic_banks import make_banks


def _clear():
    for f in (workspace.unit_line, workspace.date_label, text_features._temporal):
        f.cache_clear()


@pytest.fixture(scope="module")
def bank():
    return make_banks(1, units=203, thread_len=5.0, d=16, seed=41, prefix="txt")[0]


@pytest.mark.parametrize("headings", ["gist", "date", "none"])
def test_token_costs_past_the_cache_size_bypass_the_caches_and_are_the_same(bank, headings, monkeypatch):
    _clear()
    cached = token_costs(bank, headings)
    assert workspace.unit_line.cache_info().currsize == bank.n_units  # at most the cache's size: cached
    _clear()
    monkeypatch.setattr(workspace, "TEXT_SCAN_CACHED", bank.n_units - 1)
    big = token_costs(bank, headings)
    assert workspace.unit_line.cache_info().currsize == 0
    assert headings == "none" or workspace.date_label.cache_info().currsize == 0  # none: unit_line's own labels
    assert np.array_equal(big.unit, cached.unit) and big.unit.sum() > bank.n_units
    assert np.array_equal(big.heading, cached.heading) and big.bounded == cached.bounded
    assert (big.heading_run is None) == (cached.heading_run is None)
    assert big.heading_run is None or np.array_equal(big.heading_run, cached.heading_run)


def test_temporal_flags_past_the_cache_size_bypass_it_and_are_the_same(monkeypatch):
    texts = [f"see you on {d} at noon" if i % 3 else f"plain text {i}" for i, d in
             enumerate(["Monday", "3 May", "the lake", "2021", "yesterday"] * 9)]
    _clear()
    want = temporal_flags(texts)
    assert text_features._temporal.cache_info().currsize == len(set(texts))
    assert 0 < want.sum() < len(texts) and want.dtype == np.float64
    _clear()
    monkeypatch.setattr(text_features, "TEMPORAL_CACHED", len(texts) - 1)
    got = temporal_flags(texts)
    assert text_features._temporal.cache_info().currsize == 0
    assert np.array_equal(got, want)
    assert temporal_flags([]).shape == (0,)
    assert text_features._temporal.cache_info().maxsize == 1 << 16
