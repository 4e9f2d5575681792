"""The transfer bench's pieces that need no dev data: the chunks of banks ``select_variant``
selects from (every question once, in a chunk of its bank, chunks about ``CHUNK_UNITS`` units)
and the verdict rule (a candidate loses a column when its interval lies wholly below 0)."""
from types import SimpleNamespace as NS

import pytest

from benchmarks.transfer_bench import variants
from benchmarks.transfer_bench.run import Run


def _set(sizes: dict, asks: list[str]):
    ctxs = {b: NS(bank=NS(n_units=n)) for b, n in sizes.items()}
    return NS(questions=[NS(bank_id=b) for b in asks], ctxs=ctxs)


@pytest.mark.parametrize("cap", [1, 300, 1000, 10**6])
def test_chunks_hold_every_question_once_by_bank_within_the_cap(monkeypatch, cap):
    monkeypatch.setattr(variants, "CHUNK_UNITS", cap)
    sizes = {"a": 250, "b": 600, "c": 120, "d": 1500, "e": 90}
    asks = ["b", "a", "b", "d", "e", "c", "a", "e", "e"]
    ds = _set(sizes, asks)
    rows = [0, 2, 3, 4, 5, 6, 8]  # one weight group's questions
    chunks = variants._bank_chunks(ds, rows, ds)
    assert sorted(i for c in chunks for i in c) == rows and all(chunks)
    banks = [{asks[i] for i in c} for c in chunks]
    assert all(not (x & y) for j, x in enumerate(banks) for y in banks[j + 1:])  # a bank in one chunk
    for bs in banks:  # over the cap only when one bank is over it alone
        assert sum(sizes[b] for b in bs) <= cap or len(bs) == 1
    if cap >= sum(sizes.values()):
        assert len(chunks) == 1
    if cap == 1:
        assert len(chunks) == len({asks[i] for i in rows})


def test_no_rows_no_chunks():
    ds = _set({"a": 10}, ["a"])
    assert variants._bank_chunks(ds, [], ds) == []


def test_a_candidate_loses_a_column_only_when_its_interval_is_below_zero():
    def row(v, lo, hi, mh=None):
        d = {"ci95": [lo, hi]} | ({"multi_hop": {"ci95": list(mh)}} if mh else {})
        return {"variant": v, "fit": "locomo", "set": "locomo/plain", "T": 400, "vs_defaults": d}

    out = Run.verdicts([{"variant": "defaults"}, row("x", -0.02, 0.01), row("x", -0.03, -0.001),
                        row("y", 0.001, 0.02), row("y", -0.01, 0.01, (-0.05, -0.01))])
    assert out["x"]["loses"] and len(out["x"]["loses"]) == 1 and not out["x"]["survives"]
    assert len(out["y"]["gains"]) == 1 and len(out["y"]["loses"]) == 1  # multi-hop below 0 loses too
    assert out["x"]["columns"] == 2 and "defaults" not in out
