"""``trawmem build --segmentation llm --heads llm`` against the local OpenAI-compatible server:
LLM boundaries and heads are used, malformed output falls back per session / thread and is
counted, and a second build sends no request (response cache)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from llm_server import MALFORMED_ALWAYS
from trawmem_gpu.cli import main
from trawmem_gpu.data import sample_path
from trawmem_gpu.store import Collection


def _history(tmp_path, poison_session: bool):
    lines = [json.loads(x) for x in sample_path().read_text().splitlines() if x.strip()]
    if poison_session:  # this text makes the server answer with malformed JSON, every time
        lines[0]["text"] += f" {MALFORMED_ALWAYS}"
    p = tmp_path / "hist.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return p


@pytest.mark.parametrize("poison", [False, True])
def test_build_with_llm_segmentation_and_heads(tmp_path, monkeypatch, server, poison, capsys):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "banks"
    args = ["build", "--input", str(_history(tmp_path, poison)), "--out", str(out), "--segmentation", "llm",
            "--heads", "llm", "--llm", server.base_url, "--quiet"]
    assert main(args) == 0
    bank = Collection(out).load("ana-ben")
    lens = np.diff(bank.thread_offsets)
    stats = bank.stats
    if not poison:
        # The test server marks a boundary every 3 turns within each session.
        for s in sorted({t.session for t in bank.turns}):
            idx = [i for i, t in enumerate(bank.turns) if t.session == s]
            starts = [int(o) - idx[0] for o in bank.thread_offsets[:-1] if idx[0] <= o <= idx[-1]]
            assert starts == list(range(0, len(idx), 3))
        assert set(bank.head_kind) == {"llm"}
        assert stats.get("llm_segment_fallbacks", 0) == 0
    else:
        # Session 1's reply stays malformed after the retry: it falls back to the embedding
        # segmenter, which is counted; every unit is still in exactly one thread.
        assert stats["llm_segment_fallbacks"] == 1
        assert lens.sum() == bank.n_units and lens.min() >= 1
        assert "extractive" in bank.head_kind
        assert stats["llm_head_fallbacks"] >= 1
    printed = capsys.readouterr().out
    assert ("LLM: 1 of 3 sessions fell back to embedding segmentation" in printed) == poison
    sent = server.requests
    assert sent > 0
    # A second identical build answers every LLM call from the cache, but those whose replies
    # were malformed (never cached: each fallback's request and its retry are sent again).
    assert main(args + ["--out", str(tmp_path / "banks2")]) == 0
    rejected = stats.get("llm_segment_fallbacks", 0) + stats.get("llm_head_fallbacks", 0)
    assert server.requests == sent + 2 * rejected and (rejected > 0) == poison


def test_build_with_a_refused_key_stops_before_encoding(tmp_path, monkeypatch, server, capsys):
    import trawmem_gpu.encode as enc

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRAWMEM_API_KEY", "sk-wrong-123")
    monkeypatch.setattr(enc, "get_encoder", lambda *a, **k: pytest.fail("encoded before checking the LLM"))
    server.required_key = "sk-right"
    out = tmp_path / "banks"
    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--heads", "llm", "--llm",
                 server.base_url, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "refused the API key" in err and "sk-wrong-123" not in err and "Traceback" not in err
    assert server.requests == 0 and not (out / "banks").exists()
