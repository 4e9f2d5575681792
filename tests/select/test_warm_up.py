"""First-use costs of the approximate path paid before a query (``SelectionEngine.warm_up``,
``engine/shortlist.warm_up``, ``lexical_shortlist.warm``).

A query whose BM25 columns hold more than ``lexical_shortlist.EXACT_POSTINGS`` postings takes a
compiled pass (``lexical_dense``) the others never reach; its first one compiled it inside its own
latency (a 5-8 CPU s outlier among ~10 ms queries at 10^5 units with an empty numba cache:
``benchmarks/results/scale_outlier_1e5.json``). The engine now calls it at build with the store's
own arrays: these tests record the numba argument types of every call into ``lexical_dense`` and
check that the queries bring no type the build did not already compile."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")
import numba  # noqa: E402

from benchmarks.synthetic_banks import make_banks, make_queries  # noqa: E402
from trawmem_gpu.select.config import SelectConfig  # noqa: E402
from trawmem_gpu.select.engine import SelectionEngine, lexical_dense as ld, lexical_merge as lm, lexical_shortlist as lx  # noqa: E402

COMPILED = {True: (("lm", "blocked_scores"), ("lm", "score_ranks"), ("lm", "scores_in")),
            False: (("ld", "accumulate"), ("ld", "top_units"), ("ld", "rank_table"), ("ld", "table_ranks"))}
"""The compiled entry points a dense query calls (``lexical_shortlist.lexical`` / ``_counted``) with
``lexical_shortlist.MERGED`` on (``lexical_merge``, its ranks kept per unit: the test bank's queries
hold fewer than ``lexical_merge.FEW_SCORES`` distinct scores) and off (``lexical_dense`` alone)."""


@pytest.fixture(scope="module")
def banks():
    big = make_banks(1, units=3000, thread_len=6.0, d=32, seed=31, prefix="wbig")[0]
    small = make_banks(1, units=600, thread_len=6.0, d=32, seed=32, prefix="wsml")[0]
    return big, small, make_queries([big], 12, seed=33)


@pytest.fixture(params=[True, False], ids=["merged", "accumulated"])
def calls(request, monkeypatch):
    """Per entry point (of ``lexical_shortlist.MERGED`` on or off), the numba argument types of each
    call since the test began."""
    monkeypatch.setattr(lx, "MERGED", request.param)
    seen: dict[str, list] = {}
    for mod, name in COMPILED[request.param]:
        m = {"ld": ld, "lm": lm}[mod]
        f = getattr(m, name)
        seen[name] = []

        def spy(*args, _f=f, _name=name):
            seen[_name].append(tuple(numba.typeof(a) for a in args))
            return _f(*args)

        monkeypatch.setattr(m, name, spy)
    return seen


def _types(seen):
    return {k: set(v) for k, v in seen.items()}


def test_the_build_compiles_every_type_a_dense_query_passes(banks, calls, monkeypatch):
    big, _small, (ids, qs, Z) = banks
    eng = SelectionEngine([big], SelectConfig(), device="cpu", threads=1, ann_min_units=1000)
    built = _types(calls)
    assert all(built[k] for k in calls), built  # every entry point called at build
    for v in calls.values():
        v.clear()
    monkeypatch.setattr(lx, "EXACT_POSTINGS", 0)  # every query past it: the dense pass
    eng.select_units(ids, qs, Z)
    asked = _types(calls)
    assert all(asked[k] for k in calls), asked  # the queries did take the dense pass
    for k in calls:
        assert asked[k] <= built[k], (k, asked[k] - built[k])


def test_no_approximate_bank_no_warm_up(banks, calls):
    _big, small, _q = banks
    eng = SelectionEngine([small], SelectConfig(), device="cpu", threads=1, ann_min_units=1000)
    assert eng.warm_up() == []
    assert not any(calls.values())
    SelectionEngine([small], SelectConfig(), device="cpu", threads=1, ann_min_units=None)
    assert not any(calls.values())


def test_a_bank_grown_past_the_threshold_is_warmed_when_published(banks, calls):
    big, small, _q = banks
    eng = SelectionEngine([small], SelectConfig(), device="cpu", threads=1, ann_min_units=1000)
    assert not any(calls.values())
    eng.replace_bank(big)
    assert all(calls[k] for k in calls)


def test_warm_up_builds_the_index_and_picks_the_same(banks):
    big, _small, (ids, qs, Z) = banks
    cold = SelectionEngine([big], SelectConfig(), device="cpu", threads=1, ann_min_units=1000)
    warm = SelectionEngine([big], SelectConfig(), device="cpu", threads=1, ann_min_units=1000)
    key = ("unit_index", warm.plan.ann_kind)
    assert key not in warm.snapshot.infos[0].cache  # built on first use otherwise
    assert warm.warm_up() == [big.bank_id]
    index = warm.snapshot.infos[0].cache[key]
    assert warm.warm_up() == [big.bank_id] and warm.snapshot.infos[0].cache[key] is index  # once
    assert warm.select_units(ids, qs, Z) == cold.select_units(ids, qs, Z)
    assert warm.snapshot.infos[0].cache[key] is index  # the query used the one built ahead


def test_warm_leaves_the_accumulator_zero(banks):
    big, _small, _q = banks
    eng = SelectionEngine([big], SelectConfig(), device="cpu", threads=1, ann_min_units=1000)
    lx.warm(eng.snapshot)
    assert not np.any(ld.scratch(1))
    assert not any(np.any(a) for a in lm.scratch())
