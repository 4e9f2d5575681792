"""The compact-vectors memory benchmark (``benchmarks/bench_compact_memory.py``) on two small banks:
every choice measured at every size, the compact indexes smaller than the float32 one by their
bytes, the extrapolation a line through the measured points. No timing is asserted."""
import json

from benchmarks import bench_compact_memory as bench


def test_the_benchmark_measures_every_choice_and_extrapolates(tmp_path):
    assert bench.main(["--sizes", "1500,3000", "--dim", "32", "--queries", "4", "--shortlist", "40",
                       "--out-dir", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "compact_memory.json").read_text())
    assert (tmp_path / "compact_memory.png").stat().st_size > 0
    got = {(p["units"], p["vectors"]): p for p in rec["points"]}
    assert set(got) == {(n, v) for n in (1500, 3000) for v in bench.CHOICES}
    for n in (1500, 3000):
        b = {v: got[n, v]["index_nbytes"] for v in bench.CHOICES}
        assert b["int8"] < b["float16"] < b["float32"]
        assert got[n, "float32"]["agreement_with_float32"] == 1.0
        assert all(0.0 <= got[n, v]["recall"] <= 1.0 for v in bench.CHOICES)
    e = rec["extrapolated"]["int8"]
    assert e["index_nbytes_at_1e6"] == got[3000, "int8"]["index_nbytes"] / 3000 * 1_000_000
