"""The proxy benchmark's code at a small scale (benchmarks/bench_proxy.py): both sides measured in
every round, every request answered, the proxy's requests counted in its /metrics, the files written."""
from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("matplotlib", reason="the benchmark's figure needs matplotlib")

from benchmarks import bench_proxy, harness  # noqa: E402


def test_bench_proxy_small(tmp_path):
    args = argparse.Namespace(conc=[2], bare_conc=[1], requests=4, rounds=2, real=None, real_conc=[1], real_requests=2,
                              max_tokens=8, threads=1, timeout=600.0, out_dir=str(tmp_path))
    rec = bench_proxy.run(args)
    cell, bare = rec["cells"]
    assert (cell["upstream"], bare["upstream"], bare["conc"], bare["failed"]) == ("fake", "fake, no /tokenize", 1, 0)
    assert cell["failed"] == 0 and cell["conc"] == 2 and len(cell["rounds"]) == 2
    for r in cell["rounds"]:
        assert r["direct"]["n"] == r["proxy"]["n"] == 4
        assert r["added_p50_ms"] == pytest.approx(r["proxy"]["p50_ms"] - r["direct"]["p50_ms"])
    assert list(cell["rounds"][0])[:2] == ["direct", "proxy"] and list(cell["rounds"][1])[:2] == ["proxy", "direct"]
    assert 'trawmem_proxy_requests_total{outcome="ok"} 8.0' in rec["fake_metrics"]
    path = harness.save("proxy", rec, bench_proxy.figure(rec), str(tmp_path))
    assert json.loads(path.read_text())["cells"][0]["requests_per_side"] == 4
    assert (tmp_path / "proxy.png").stat().st_size > 0
