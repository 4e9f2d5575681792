"""The offline vLLM backend (``vllm:``) constrains structured calls to their schema through vLLM's
structured outputs, and an engine that refuses the schema gets JSON mode (said once); checked
against a stand-in ``vllm`` module (vLLM itself needs a GPU)."""
from __future__ import annotations

import sys
import types

import pytest

from trawmem_gpu.llm.prompts import HEAD


def _fake_vllm(refuse_schema: bool):
    made = []

    class StructuredOutputsParams:
        def __init__(self, json=None, json_object=None):
            if refuse_schema and json is not None:
                raise ValueError("this engine's grammar backend does not support the schema")
            self.json, self.json_object = json, json_object

    class SamplingParams:
        def __init__(self, **kw):
            made.append(kw)
            self.kw = kw

    class _Comp:
        def __init__(self, text):
            self.text, self.token_ids, self.finish_reason = text, [1, 2, 3], "stop"

    class _Out:
        def __init__(self, text):
            self.outputs, self.prompt_token_ids = [_Comp(text)], [1] * 7

    class LLM:
        def __init__(self, model, **kw):
            self.model = model

        def chat(self, batch, sampling_params=None, use_tqdm=False):
            return [_Out('{"head": "Ana ran the Porto half marathon in April."}') for _ in batch]

    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    sp = types.ModuleType("vllm.sampling_params")
    sp.StructuredOutputsParams = StructuredOutputsParams
    return mod, sp, made


@pytest.mark.parametrize("refuse", [False, True])
def test_structured_calls_send_their_schema_or_fall_back_to_json_mode(monkeypatch, refuse, caplog):
    mod, sp, made = _fake_vllm(refuse)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    from trawmem_gpu.llm.vllm_offline import VLLMOfflineBackend

    be = VLLMOfflineBackend("/models/x", progress=False)
    for _ in range(2):
        r = be.chat([HEAD.messages(thread="t")], max_tokens=64, json_mode=True, schema=HEAD.schema)[0]
        assert r.ok and r.finish_reason == "stop" and r.completion_tokens == 3
    so = [kw["structured_outputs"] for kw in made if "structured_outputs" in kw]
    if refuse:
        assert all(p.json is None and p.json_object for p in so) and be.schema_refusal
        assert "refused the JSON schema" in caplog.text and be.describe()["schema_refusal"]
        assert sum("refused the JSON schema" in r.message for r in caplog.records) == 1
    else:
        assert [p.json for p in so] == [HEAD.schema, HEAD.schema] and be.schema_refusal is None
    be.constrain = "json"  # --llm-constrain json: JSON mode alone
    made.clear()
    be.chat([HEAD.messages(thread="t")], max_tokens=64, json_mode=True, schema=HEAD.schema)
    assert made[-1]["structured_outputs"].json is None and be.schema_sent(HEAD.schema) is None
