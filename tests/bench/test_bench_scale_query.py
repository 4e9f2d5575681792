"""The query-side scaling curves (``benchmarks/scale_bench/query.py``): the smallest sizes run,
every curve has its points, the step model reads the engine's step timings, and the figure draws."""
import math

from benchmarks.scale_bench import query


def test_quick_curves_measure_every_point_and_model_the_steps():
    rec = query.run_query_curves(quick=True, inline=True, progress=False, rounds=3)
    pts = rec["size"]["d64"]["points"]
    assert [p["units"] for p in pts] == list(query.QUICK["sizes"])
    for p in pts + rec["size"]["d384"]["points"] + rec["banks"] + [rec["batch_size"]]:
        assert "error" not in p, p
        assert p["latency_ms"]["p50"] > 0 and all(v > 0 for v in p["qps"].values())
        assert {"similarity", "localize", "select"} <= set(p["steps_ms"]), p["steps_ms"]
        assert p["vmhwm_mib"] > 0 and p["engine_mib"] > 0
    assert [p["spec"]["n_banks"] for p in rec["banks"]] == list(query.QUICK["banks"])
    assert sorted(map(int, rec["batch_size"]["qps"])) == sorted(query.QUICK["batches"])
    ann = rec["ann"][0]
    assert "error" not in ann and ann["units"] == query.QUICK["ann_sizes"][0][0]
    assert 0.0 < ann["candidate_recall"]["mean"] <= 1.0 and ann["approx_ms"] > 0 and ann["exact_ms"] > 0
    model = rec["size"]["d64"]["model"]
    assert set(model["fit"]) == set().union(*(p["steps_ms"] for p in pts))
    assert math.isfinite(model["loglog_slope_last"]) and model["dominant_at_largest"] in model["fit"]
    fig = query.figure(rec)
    assert len(fig.axes) >= 3
