"""Offline vLLM backend: one engine in this process, batched ``LLM.chat`` calls."""
from __future__ import annotations

import logging
import time
from typing import Optional

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm.base import LLMBackend, LLMResult

log = logging.getLogger(__name__)


def _json_sampling_kwargs(schema: Optional[dict] = None) -> dict:
    """SamplingParams kwargs constraining decoding to ``schema`` (None: to any JSON object), for
    whichever vLLM version is installed: structured outputs (newer vLLM), else guided decoding
    (vLLM 0.6 - 0.10); {} when neither exists."""
    what = {"json": schema} if schema is not None else {"json_object": True}
    try:
        from vllm.sampling_params import StructuredOutputsParams  # newer vLLM

        return {"structured_outputs": StructuredOutputsParams(**what)}
    except ImportError:
        pass
    try:
        from vllm.sampling_params import GuidedDecodingParams  # vLLM 0.6 - 0.10

        return {"guided_decoding": GuidedDecodingParams(**what)}
    except ImportError:
        return {}


class VLLMOfflineBackend(LLMBackend):
    """Runs a local model with vLLM (``pip install trawmem_gpu[vllm]``).

    ``engine_kwargs`` go to ``vllm.LLM`` unchanged (``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``max_model_len``...). Latency per result is the batch wall time
    divided by the batch size (the engine batches internally).
    """

    name = "vllm"
    takes_schema = True
    constrain = "schema"
    """``schema``: structured calls are constrained to their JSON schema; ``json``: to a JSON object."""

    def __init__(self, model_path: str, *, progress: bool = True, **engine_kwargs) -> None:
        super().__init__()
        if not model_path:
            raise ConfigError("vllm backend needs a model path or id: vllm:MODEL_PATH")
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ConfigError(
                f"vLLM is not installed, needed for vllm:{model_path}: pip install trawmem_gpu[vllm] "
                f"(or use an OpenAI-compatible server: http://HOST:PORT/v1) [{e}]"
            ) from None
        self._vllm = vllm
        self._model = str(model_path)
        self.progress = bool(progress)
        self.engine_kwargs = dict(engine_kwargs)
        """Keyword arguments passed to ``vllm.LLM``."""
        self._llm = vllm.LLM(model=self._model, **engine_kwargs)
        self._json_kwargs: Optional[dict] = None
        self.schema_refusal: Optional[str] = None
        """Why the engine refused JSON schemas (then structured calls use JSON mode), when it did."""

    def __repr__(self) -> str:
        return f"VLLMOfflineBackend(model={self._model!r}, engine_kwargs={self.engine_kwargs!r})"

    def describe(self) -> dict:
        return {"backend": self.name, "model": self.model, "schema_refusal": self.schema_refusal}

    def _sampling(self, max_tokens: int, temperature: float, json_mode: bool, schema: Optional[dict] = None):
        """SamplingParams for one batch: constrained to ``schema`` (structured outputs), else to a
        JSON object with ``json_mode``; a version or engine that refuses the schema gets JSON mode
        from then on (``schema_refusal`` says why), one without JSON mode gets none."""
        kw = {"max_tokens": max_tokens, "temperature": temperature}
        if json_mode and schema is not None and self.schema_refusal is None:
            try:
                return self._vllm.SamplingParams(**kw, **_json_sampling_kwargs(schema))
            except (TypeError, ValueError) as e:
                self.schema_refusal = f"{type(e).__name__}: {e}"[:300]
                log.warning("vLLM refused the JSON schema (%s); structured calls use JSON mode", self.schema_refusal)
        if json_mode:
            if self._json_kwargs is None:
                self._json_kwargs = _json_sampling_kwargs()
            kw.update(self._json_kwargs)
        try:
            return self._vllm.SamplingParams(**kw)
        except TypeError:  # JSON-mode field not accepted by this version
            kw = {"max_tokens": max_tokens, "temperature": temperature}
            self._json_kwargs = {}
            return self._vllm.SamplingParams(**kw)

    def schema_sent(self, schema):
        return None if self.constrain == "json" else schema

    def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result, schema=None):
        schema = self.schema_sent(schema)
        params = self._sampling(max_tokens, temperature, json_mode, schema)
        t0 = time.perf_counter()
        try:
            outputs = self._llm.chat(batch, sampling_params=params, use_tqdm=self.progress)
        except ValueError as e:  # the engine refused the schema when it compiled it
            if schema is None or self.schema_refusal is not None:
                raise
            self.schema_refusal = f"{type(e).__name__}: {e}"[:300]
            log.warning("vLLM refused the JSON schema (%s); structured calls use JSON mode", self.schema_refusal)
            params = self._sampling(max_tokens, temperature, json_mode, None)
            outputs = self._llm.chat(batch, sampling_params=params, use_tqdm=self.progress)
        wall = time.perf_counter() - t0
        per = wall / max(1, len(batch))
        results = []
        for i, out in enumerate(outputs):
            comp = out.outputs[0] if getattr(out, "outputs", None) else None
            text = comp.text if comp is not None else ""
            ptoks = len(getattr(out, "prompt_token_ids", None) or [])
            ctoks = len(getattr(comp, "token_ids", None) or []) if comp is not None else 0
            err = None if comp is not None else "engine returned no completion"
            r = LLMResult(text=text, prompt_tokens=ptoks, completion_tokens=ctoks, latency_s=per, error=err,
                          finish_reason=getattr(comp, "finish_reason", None))
            if on_result is not None:
                on_result(i, r)
            results.append(r)
        return results
