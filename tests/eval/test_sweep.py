"""``trawmem sweep``: the grid, flag errors, the Pareto marks, and an end-to-end run on a tiny
made-up LoCoMo file whose per-cell quality must equal the evaluation harness's, for both
engines."""
from __future__ import annotations

import json

import numpy as np
import pytest

from locomo_files import write_tiny_locomo
from trawmem_gpu.cli import main
from trawmem_gpu.errors import InputError
from trawmem_gpu.eval.analyses import pareto_mask
from trawmem_gpu.eval.sweep import Cell, grid, parse_int_list
from trawmem_gpu.eval.sweep_report import mark_pareto


def test_grid_cells():
    cells = grid(["trawmem", "hybrid"], [1, 3], [4, 16])
    assert [c.key for c in cells] == ["trawmem B=4 H=1", "trawmem B=16 H=1", "trawmem B=4 H=3", "trawmem B=16 H=3",
                                      "hybrid B=4", "hybrid B=16"]
    assert cells[-1] == Cell("hybrid", 16, None)
    with pytest.raises(InputError, match="`methods`: unknown method 'rag'"):
        grid(["rag"], [1], [4])


@pytest.mark.parametrize("text, minimum, expect", [
    ("1,2,3", 0, [1, 2, 3]),
    ("16, 4,16", 1, [16, 4]),
    ("1,x", 0, "expected comma-separated integers, got '1,x'"),
    ("0,4", 1, "every value must be at least 1, got 0"),
    (" , ", 1, "at least one value"),
])
def test_parse_int_list(text, minimum, expect):
    if isinstance(expect, list):
        assert parse_int_list(text, minimum) == expect
    else:
        with pytest.raises(InputError, match=expect):
            parse_int_list(text, minimum)


def test_mark_pareto_matches_the_definition():
    rng = np.random.default_rng(3)
    cells = [{"evidence_recall": float(r), "latency_ms": {"p50": float(l)}, "context_tokens": {"mean": float(t)}}
             for r, l, t in zip(rng.random(12), rng.random(12), rng.random(12) * 1000)]
    mark_pareto(cells)
    rec = [c["evidence_recall"] for c in cells]
    assert [c["pareto_latency"] for c in cells] == pareto_mask(rec, [c["latency_ms"]["p50"] for c in cells]).tolist()
    assert [c["pareto_tokens"] for c in cells] == pareto_mask(rec, [c["context_tokens"]["mean"] for c in cells]).tolist()
    best = int(np.argmax(rec))
    assert cells[best]["pareto_latency"] and cells[best]["pareto_tokens"]  # the best recall is always optimal


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny file and a bank collection built from it once."""
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.data import load_conversations
    from trawmem_gpu.store import Collection

    d = tmp_path_factory.mktemp("sweep")
    data = write_tiny_locomo(d / "tiny.json")
    convs = load_conversations(data)
    banks, _ = build_banks(convs, progress=False)
    coll = Collection(d / "banks", create=True)
    for b in banks:
        coll.put(b)
    return data, d / "banks", convs, banks


@pytest.mark.parametrize("engine", ["reference", "batched"])
def test_sweep_end_to_end(tiny, tmp_path, capsys, engine):
    from trawmem_gpu.eval.retrieval import run_eval
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    data, banks_dir, convs, banks = tiny
    out = tmp_path / "sw.json"
    rc = main(["sweep", "--data", str(data), "--hops", "1,2", "--budget", "2,4", "--method", "trawmem,cosine",
               "--engine", engine, "--batch-size", "3", "--rounds", "2", "--warmup", "1", "--banks", str(banks_dir),
               "--output", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert res["n_questions"] == 5 and res["engine"] == engine   # category 5 is left out
    keys = [c["key"] for c in res["cells"]]
    assert keys == ["trawmem B=2 H=1", "trawmem B=4 H=1", "trawmem B=2 H=2", "trawmem B=4 H=2",
                    "cosine B=2", "cosine B=4"]
    for c in res["cells"]:
        assert f"| {c['method']} | {c['hops'] if c['hops'] is not None else '-'} | {c['budget']} |" in printed
        lat = c["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
        tp = c["throughput"]
        if c["method"] == "trawmem":
            assert tp["batch_size"] == 3 and tp["rounds"] == 2 and tp["qps"] > 0 and tp["queries"] == 5
        else:
            assert tp is None
        # the same quality as the evaluation harness on the same banks
        qp = QueryParams(budget=c["budget"], **({} if c["hops"] is None else {"hops": c["hops"]}))
        ev = run_eval(data, c["method"], SelectConfig(), banks_and_convs=(convs, banks), progress=False, params=qp)
        assert c["evidence_recall"] == pytest.approx(ev["macro"]["evidence_recall"], abs=1e-12)
        assert c["all_evidence_hit"] == pytest.approx(ev["macro"]["all_evidence_hit"], abs=1e-12)
        assert c["context_tokens"]["mean"] == pytest.approx(np.mean([r["context_tokens"] for r in ev["records"]]))
    # larger budgets give more tokens; every flag is a bool and the Pareto sets are not empty
    by = {c["key"]: c for c in res["cells"]}
    assert by["trawmem B=4 H=1"]["context_tokens"]["mean"] > by["trawmem B=2 H=1"]["context_tokens"]["mean"]
    assert any(c["pareto_latency"] for c in res["cells"]) and any(c["pareto_tokens"] for c in res["cells"])
    assert res["build"]["per_bank"][0]["bank_id"] == "tiny-1" and res["encode_ms"]["p50"] > 0
    assert res["query_threads"] == 1
    # one engine for the whole grid: every TrawMem cell reports the same (single) engine build
    setups = {c["engine_setup_s"] for c in res["cells"] if c["method"] == "trawmem"}
    assert len(setups) == 1


def test_sweep_measures_a_fresh_build(tiny, tmp_path):
    data = tiny[0]
    out = tmp_path / "fresh.json"
    assert main(["sweep", "--data", str(data), "--hops", "1", "--budget", "4", "--method", "bm25",
                 "--output", str(out), "--quiet", "--warmup", "0", "--time-builds"]) == 0
    res = json.loads(out.read_text())
    row = res["build"]["per_bank"][0]
    assert res["build"]["source"].startswith("measured now")
    assert row["units"] == 12 and row["build_s"] > 0 and row["encode_units_s"] > 0
    assert [c["key"] for c in res["cells"]] == ["bm25 B=4"]


def test_sweep_reuses_banks_by_default_and_explains_pareto(tiny, tmp_path, monkeypatch, capsys):
    """Without --banks the sweep uses eval's automatic bank cache: built once, then reused (no
    build at all on the second run); build times are measured only with --time-builds."""
    import trawmem_gpu.ingest as construct

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    data = tiny[0]
    argv = ["sweep", "--data", str(data), "--hops", "1", "--budget", "2,4", "--method", "trawmem",
            "--output", str(tmp_path / "a.json"), "--quiet", "--warmup", "0", "--rounds", "1"]
    assert main(argv) == 0
    first = json.loads((tmp_path / "a.json").read_text())
    assert not first["build"]["source"].startswith("measured now")
    assert list((tmp_path / "cache" / "banks").glob("*/collection.json"))
    monkeypatch.setattr(construct, "build_banks", lambda *a, **k: pytest.fail("rebuilt banks the cache holds"))
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Pareto: L = Pareto-optimal in macro evidence recall against latency p50" in printed
    assert "T = the same against mean context tokens" in printed
    second = json.loads((tmp_path / "a.json").read_text())
    assert [c["evidence_recall"] for c in second["cells"]] == [c["evidence_recall"] for c in first["cells"]]
    assert main(argv + ["--time-builds", "--banks", str(tiny[1])]) == 2
    assert "--time-builds measures fresh builds; it does not take --banks" in capsys.readouterr().err


@pytest.mark.parametrize("args, match", [
    (["--hops", "1,x"], "argument --hops: expected comma-separated integers, got '1,x'"),
    (["--budget", "0"], "argument --budget: every value must be at least 1, got 0"),
    (["--method", "trawmem,rag"], "argument --method: unknown method 'rag'"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--warmup", "-1"], "argument --warmup: must be 0 or more"),
    (["--categories", "1,9"], "argument --categories: expected comma-separated categories 1-5"),
])
def test_sweep_flags_checked_at_parse_time(tmp_path, capsys, monkeypatch, args, match):
    import trawmem_gpu.encode as enc

    monkeypatch.setattr(enc, "get_encoder", lambda *a, **k: pytest.fail("loaded a model before checking flags"))
    with pytest.raises(SystemExit) as ei:
        main(["sweep", "--quiet", "--data", "D.json", "--output", str(tmp_path / "x.json"), *args])
    assert ei.value.code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_sweep_missing_data(tmp_path, capsys):
    assert main(["sweep", "--quiet", "--data", str(tmp_path / "nope.json"), "--output", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"trawmem sweep: error: --data {tmp_path / 'nope.json'}: file not found"
    assert not (tmp_path / "x.json").exists()
