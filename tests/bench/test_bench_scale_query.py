"""The query-side scaling curves (``benchmarks/scale_bench/query.py``): the smallest sizes run,
every curve has its points (with p99, the first query apart, the plan's threshold; the
approximate points with both searches' throughput and the index's time per append), the step model reads the engine's step timings, and the figure draws."""
import math

import pytest

from benchmarks.scale_bench import query


def test_quick_curves_measure_every_point_and_model_the_steps():
    rec = query.run_query_curves(quick=True, inline=True, progress=False, rounds=3)
    pts = rec["size"]["d64"]["points"]
    assert [p["units"] for p in pts] == list(query.QUICK["sizes"])
    for p in pts + rec["size"]["d384"]["points"] + rec["banks"] + [rec["batch_size"]]:
        assert "error" not in p, p
        assert p["latency_ms"]["p50"] > 0 and all(v > 0 for v in p["qps"].values())
        assert {"similarity", "localize", "select"} <= set(p["steps_ms"]), p["steps_ms"]
        assert p["vmhwm_mib"] > 0 and p["engine_mib"] > 0 and 0 < p["rssanon_mib"] <= p["vmrss_mib"]
        assert p["index_append_ms"] == {}  # exact (below the threshold): no index to keep current
        assert p["latency_ms"]["p50"] <= p["latency_ms"]["p99"] and p["first_query_s"] > 0
        assert p["warm_up_s"] >= 0 and p["warmed_banks"] == int(p["plan"]["approximate"])  # one bank: its index
        assert p["plan"]["approximate"] == (p["plan"]["ann_min_units"] is not None
                                            and p["units"] / p["spec"]["n_banks"] >= p["plan"]["ann_min_units"])
    assert [p["spec"]["n_banks"] for p in rec["banks"]] == list(query.QUICK["banks"])
    assert sorted(map(int, rec["batch_size"]["qps"])) == sorted(query.QUICK["batches"])
    ann = rec["ann"][0]
    assert "error" not in ann and ann["units"] == query.QUICK["ann_sizes"][0][0]
    assert 0.0 < ann["candidate_recall"]["mean"] <= 1.0 and ann["approx_ms"] > 0 and ann["exact_ms"] > 0
    assert ann["approx_ms"] <= ann["approx_p99_ms"] and ann["exact_ms"] <= ann["exact_p99_ms"]
    assert ann["qps"]["exact"] > 0 and ann["qps"]["approx"] > 0 and ann["qps_batch"] >= 1
    assert set(ann["index_append_ms"]) == {"1", "8"} and all(v > 0 for v in ann["index_append_ms"].values())
    model = rec["size"]["d64"]["model"]
    assert set(model["fit"]) == set().union(*(p["steps_ms"] for p in pts))
    assert math.isfinite(model["loglog_slope_last"]) and model["dominant_at_largest"] in model["fit"]
    fig = query.figure(rec)
    assert len(fig.axes) >= 3


@pytest.mark.parametrize("vectors", ["float32", "int8"])
def test_append_update_grows_the_index_by_the_appended_units_and_keeps_the_engines_answers(vectors):
    """``ann.append_update_ms`` times ``VectorIndex.grown`` on the engine's own index: nothing
    before the first approximate query (no index yet), then one time per append size, and the
    engine still picks as before (the grown index is a new object; the old one masks the added ids).
    A compact index grows with the float vectors of every unit it then holds (its re-rank), the
    ones earlier repeats added included."""
    from benchmarks.scale_bench.ann import append_update_ms
    from benchmarks.synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    banks = make_banks(1, units=900, d=32, seed=3)
    ids, qs, Z = make_queries(banks, 4, seed=4)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, vectors=vectors)
    assert append_update_ms(eng) == {}
    before = eng.select_units(ids, qs, Z)
    info = eng.snapshot.infos[0]
    index = next(v[0] for k, v in info.cache.items() if isinstance(k, tuple) and k[0] == "unit_index")
    n0 = int(index.index.ntotal)
    got = append_update_ms(eng, sizes=(1, 3), repeats=2)
    assert set(got) == {"1", "3"} and all(v > 0 for v in got.values())
    assert int(index.index.ntotal) == n0 + 2 * (1 + 3)  # the faiss index gained every appended vector
    assert eng.select_units(ids, qs, Z) == before


def test_an_approximate_size_point_times_its_index_per_append():
    """A size point past the threshold (forced to 1) reports its index's time per append of 1 and
    8 units; the checkout's commit is a 40-hex HEAD (``+dirty`` when edited)."""
    import re

    rec = query.point(dict(kind="size", n_banks=1, units=700, dim=32, seed=5, rounds=3, batch=4, threads=1,
                           engine={"ann_min_units": 1}))
    assert rec["plan"]["approximate"] is True
    assert rec["warmed_banks"] == 1 and rec["warm_up_s"] > 0  # its index built before the first query
    assert set(rec["index_append_ms"]) == {"1", "8"} and all(v > 0 for v in rec["index_append_ms"].values())
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", query.commit() or "")


def test_merge_joins_pieces_by_width_and_size_and_refits_the_model():
    """``query.merge``: the size points of every part, sorted per width, the model refitted over
    them, the approximate points of all parts, each part's command kept; no part is refused."""
    import pytest

    def pt(n, ms):
        return {"spec": {"units": n}, "units": n, "latency_ms": {"p50": ms}, "steps_ms": {"similarity": ms}}

    a = {"threads": 1, "command": "a", "size": {"d64": {"points": [pt(1000, 1.0), pt(100000, 10.0)]}},
         "ann": [{"spec": {"dim": 64, "units": 10}, "units": 10, "approx_ms": 2.0, "exact_ms": 1.0}],
         "banks": [], "batch_size": {}}
    b = {"threads": 1, "command": "b", "commit": "c0ffee", "size": {"d64": {"points": [pt(10000, 3.0)]}, "d384": {"points": [pt(10, 1.0)]}},
         "ann": [{"spec": {"dim": 64, "units": 5}, "units": 5, "approx_ms": 2.0, "exact_ms": 1.0}]}
    m = query.merge([a, b])
    assert [p["units"] for p in m["size"]["d64"]["points"]] == [1000, 10000, 100000]
    assert m["size"]["d64"]["model"]["fit"]["similarity"]["per_unit_us"] > 0
    assert m["size"]["d384"]["model"] == {}  # one point: nothing to fit
    assert [p["spec"]["units"] for p in m["ann"]] == [5, 10]
    assert [p["command"] for p in m["parts"]] == ["a", "b"] and m["threads"] == 1
    assert [p["commit"] for p in m["parts"]] == [None, "c0ffee"] and "commit" not in m
    assert len(query.figure(m).axes) == 1
    with pytest.raises(ValueError, match="at least one"):
        query.merge([])


def test_a_cached_bank_is_read_as_generated_and_a_mismatched_one_refused(tmp_path):
    """``ann.cached_bank``: no ``bank_cache`` or no file gives None (the point generates its bank);
    the sweep's pickle is read back as the bank ``make_banks`` makes for the spec (same vectors);
    a file of another size or another seed is refused."""
    import pickle

    import numpy as np
    import pytest

    from benchmarks.scale_bench.ann import cache_path, cached_bank
    from benchmarks.synthetic_banks import make_banks

    spec = dict(units=400, dim=16, seed=7, topics=9, bank_cache=str(tmp_path))
    assert cached_bank(dict(spec, bank_cache=None)) is None and cached_bank(spec) is None
    assert cache_path(spec).name == "bank_400_16_t9.pkl" and cache_path(dict(spec, topics=6)).name == "bank_400_16.pkl"
    banks = make_banks(1, units=400, d=16, seed=7, topics=9)
    cache_path(spec).write_bytes(pickle.dumps(banks))
    got = cached_bank(spec)
    assert got[0].n_units == 400 and np.array_equal(got[0].unit_vecs, banks[0].unit_vecs)
    with pytest.raises(ValueError, match="seed 8"):
        cached_bank(dict(spec, seed=8))
    cache_path(dict(spec, units=500)).write_bytes(pickle.dumps(banks))
    with pytest.raises(ValueError, match="500 units"):
        cached_bank(dict(spec, units=500))


def test_approximate_points_time_several_passes_and_several_processes():
    """``passes`` times the approximate queries that many times in a row (a median per pass, p50 /
    p99 over all of them); ``processes`` measures the point that many times (fresh processes, or
    this one when ``inline``) and reads the median of their p50s."""
    rec = query.run_query_curves(quick=True, inline=True, progress=False, rounds=3, sizes=(), sizes_wide=(), banks=(),
                                 batches=(), passes=2, processes=2)
    ann = rec["ann"][0]
    assert "error" not in ann and ann["spec"]["passes"] == 2 and len(ann["approx_pass_ms"]) == 2
    assert all(t > 0 for t in ann["approx_pass_ms"]) and ann["approx_ms"] <= ann["approx_p99_ms"]
    assert len(ann["processes"]) == 2 and ann["errors"] == []
    over = ann["approx_ms_processes"]
    p50 = sorted(p["approx_ms"] for p in ann["processes"])
    assert over["n"] == 2 and over["min"] == p50[0] and over["max"] == p50[1] and over["median"] == sum(p50) / 2
    assert all(0.0 < p["candidate_recall"] <= 1.0 and 0.0 <= p["pick_recall"] <= 1.0 for p in ann["processes"])


def test_over_processes_keeps_one_record_alone_and_reads_the_median_without_the_failed_ones():
    def rec(ms):
        return {"spec": {}, "approx_ms": ms, "approx_p99_ms": 2 * ms, "candidate_recall": {"mean": 0.99},
                "pick_recall": {"mean": 0.98}}

    one = rec(5.0)
    assert query.over_processes([one]) is one
    got = query.over_processes([rec(5.0), {"spec": {}, "error": "killed"}, rec(4.0), rec(6.5)])
    assert got["approx_ms"] == 5.0 and got["errors"] == ["killed"] and len(got["processes"]) == 3
    assert got["approx_ms_processes"] == {"median": 5.0, "min": 4.0, "max": 6.5, "n": 3, "p99_median": 10.0}
    failed = {"spec": {}, "error": "boom"}
    assert query.over_processes([failed, {"spec": {}, "error": "again"}]) is failed


def test_switch_model_recovers_the_costs_behind_the_threshold():
    """``switch_model`` fits ``a + N (b + c d)`` to both searches' p50s (what ``engine/plan.py``
    ships as ``EXACT_MS`` / ``APPROX_MS``) and gives the threshold ``ann_threshold`` reads from them."""
    from trawmem_gpu.select.engine.plan import ann_threshold

    exact, approx = (0.5, 4e-5, 3e-7), (3.0, 1e-6, 1e-9)
    cost = lambda f, n, d: f[0] + n * (f[1] + f[2] * d)  # noqa: E731
    pts = [{"spec": {"dim": d}, "units": n, "exact_ms": cost(exact, n, d), "approx_ms": cost(approx, n, d)}
           for n in (10_000, 100_000, 1_000_000) for d in (64, 384)]
    pts.append({"spec": {"dim": 64}, "units": 5, "error": "killed"})
    got = query.switch_model(pts)
    for name, want in (("exact_ms", exact), ("approx_ms", approx)):
        assert got[name] == pytest.approx(want, rel=1e-6)
        assert max(abs(r) for r in got[name + "_residual"]) < 1e-6
    assert got["threshold"] == {"64": ann_threshold(64, got["exact_ms"], got["approx_ms"]),
                                "384": ann_threshold(384, got["exact_ms"], got["approx_ms"])}
    n = got["threshold"]["384"]  # the smallest bank where exact costs twice the approximate search
    assert cost(exact, n, 384) >= 2 * cost(approx, n, 384) > cost(exact, n - 1, 384)
    assert query.switch_model(pts[:2]) == {}  # one size: the per-unit costs are not determined


def test_ann_threshold_is_none_where_approximate_search_never_pays():
    from trawmem_gpu.select.engine.plan import ann_threshold

    assert ann_threshold(384, (1.0, 1e-5, 0.0), (2.0, 1e-5, 0.0)) is None  # the same cost per unit
    assert ann_threshold(384, (5.0, 1e-5, 0.0), (1.0, 0.0, 0.0)) == 1  # cheaper at any size


def test_the_shipped_switch_costs_are_the_saved_runs_fit():
    """``engine/plan.py``'s ``EXACT_MS`` / ``APPROX_MS`` are the ``switch`` fit of the run its
    docstring names (to three significant figures), so the threshold follows a measurement."""
    import json
    from pathlib import Path

    from trawmem_gpu.select.engine import plan

    rec = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/scale_query_stop60.json").read_text())
    again = query.switch_model(rec["ann"])
    assert again["threshold"] == rec["switch"]["threshold"]
    for k in ("exact_ms", "approx_ms"):
        assert again[k] == pytest.approx(rec["switch"][k], rel=1e-9)
    for shipped, fit in ((plan.EXACT_MS, rec["switch"]["exact_ms"]), (plan.APPROX_MS, rec["switch"]["approx_ms"])):
        assert shipped == pytest.approx(fit, rel=5e-3)
    for d, n in rec["switch"]["threshold"].items():
        assert plan.ann_threshold(int(d)) == pytest.approx(n, rel=5e-3)


@pytest.mark.parametrize("flag", ["--passes", "--processes"])
def test_scale_query_refuses_fewer_than_one_pass_or_process(flag, capsys):
    from benchmarks import bench_scale_query

    with pytest.raises(SystemExit) as e:
        bench_scale_query.main(["--only", "ann", flag, "0"])
    assert e.value.code == 2 and f"{flag} must be at least 1, got 0" in capsys.readouterr().err
