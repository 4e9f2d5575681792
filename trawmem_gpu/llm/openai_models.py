"""``GET {base_url}/models`` for an OpenAI-compatible backend (``llm.openai_http``): the server
answers, accepts the key and serves the model; the model and its context are read from the listing."""
from __future__ import annotations

import logging
import time

import httpx

from trawmem_gpu.errors import ConfigError, name_list
from trawmem_gpu.llm.base import LLMRequestError
from trawmem_gpu.llm.openai_transport import RETRY_STATUS

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 120.0
"""Bound on ``GET /models`` when no timeout is given (a busy one-at-a-time server answers it only
after the completion it is running)."""


def check_models(self: "OpenAIHTTPBackend") -> None:
    """``GET {base_url}/models``: the server answers, accepts the key, and serves the model.

    Sets the model to the first one listed when none was given, and the model's context when
    the listing gives it (vLLM's ``max_model_len``, llama.cpp's ``n_ctx``). Raises
    ``ConfigError`` for a refused key (HTTP 401/403) or a model the server does not list,
    ``LLMRequestError`` when the server cannot be reached after the retries. A server
    without ``/models`` (404) is accepted when a model was named.
    """
    url = f"{self.base_url}/models"
    last = "no attempt"
    for attempt in range(self.max_retries + 1):
        try:
            with httpx.Client(timeout=self.timeout_s or CHECK_TIMEOUT_S) as client:
                r = client.get(url, headers=self._headers())
            if r.status_code in (401, 403):
                how = "the API key from TRAWMEM_API_KEY / OPENAI_API_KEY" if self._key else "no API key"
                raise ConfigError(self._scrub(
                    f"the LLM server at {self.base_url} refused {how} (HTTP {r.status_code} from GET /models); "
                    f"set TRAWMEM_API_KEY (or OPENAI_API_KEY) to a key it accepts"))
            if r.status_code == 404 and self._model is not None:
                log.warning("%s has no /models endpoint; cannot check the key and model up front", self.base_url)
                return
            if r.status_code == 200:
                _take_models(self, r.json().get("data") or [], url)
                return
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code not in RETRY_STATUS:
                break
        except httpx.TransportError as e:
            last = f"{type(e).__name__}: {e}"
        except (ValueError, AttributeError) as e:  # bad JSON
            if isinstance(e, ConfigError):
                raise
            last = f"bad JSON from /models: {e}"
            break
        if attempt < self.max_retries:
            time.sleep(self._delay(attempt, None))
    raise LLMRequestError(self._scrub(f"could not reach the LLM server: GET {url} failed ({last})"))


def _take_models(self: "OpenAIHTTPBackend", data: list, url: str) -> None:
    """The model (the first listed when none was given; a named one must be listed) and its
    context, when the listing gives it."""
    entries = [d for d in data if isinstance(d, dict) and d.get("id")]
    ids = [str(d["id"]) for d in entries]
    if self._model is None:
        if not ids:
            raise LLMRequestError(f"GET {url} listed no models; pass MODEL as URL@MODEL")
        self._model = ids[0]
    elif ids and self._model not in ids:
        raise ConfigError(f"model {self._model!r} is not served at {self.base_url} (it serves "
                          f"{name_list(ids)}); fix the @MODEL part of the LLM spec")
    mine = next((d for d in entries if str(d["id"]) == self._model), None)
    meta = (mine or {}).get("meta") if isinstance((mine or {}).get("meta"), dict) else {}
    for v in ((mine or {}).get("max_model_len"), (mine or {}).get("context_length"), meta.get("n_ctx"),
              meta.get("n_ctx_train")):
        if isinstance(v, int) and v > 0 and not self.options.context_tokens:
            self.state.learn_context(v, "GET /models")
            break
