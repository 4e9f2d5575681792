"""The chat-completions proxy in front of the real llama.cpp server (tests marked ``real_llm``:
opt-in, tests/support/real_llm_fixture.py): the answer comes back streamed and not, the workspace
is counted in the model's own tokens (its tokenize endpoint), and the exchange is appended."""
from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_util import running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.proxy import HEADER  # noqa: E402

pytestmark = pytest.mark.real_llm


def _tokens(base: str, text: str) -> int:
    """The model's own count of ``text`` (llama.cpp's /tokenize, or llama-cpp-python's /extras/tokenize)."""
    root = base[:-3] if base.endswith("/v1") else base
    for path, body in (("/tokenize", {"content": text}), ("/extras/tokenize", {"input": text})):
        r = httpx.post(root + path, json=body, timeout=60)
        if r.status_code == 200:
            return len(r.json()["tokens"])
    pytest.fail("the real server has no tokenize endpoint")


def test_proxy_in_front_of_the_real_model(real_llm_url, coll):
    cfg = ServeConfig(collection=coll, upstream=real_llm_url, max_wait_ms=1, upstream_timeout_s=300)
    body = {"model": "real", "user": "ana-ben", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Why did Ana walk home during her long run?"}]}
    with running(cfg) as (url, _, _):
        with httpx.Client(base_url=url, timeout=600) as c:
            before = c.get("/v1/banks/ana-ben").json()["n_units"]
            r = c.post("/v1/chat/completions", json=body, headers={"X-Trawmem-Token-Budget": "300"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"].strip()
            tokens = int(r.headers["X-Trawmem-Workspace-Tokens"])
            assert tokens > _tokens(real_llm_url, HEADER)  # the header and a workspace, in the model's tokens
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True,
                                                                 "messages": [{"role": "user", "content": "Who is Ben?"}]}) as s:
                assert s.status_code == 200
                raw = b"".join(s.iter_raw())
            events = [ln[5:].strip() for ln in raw.decode().splitlines() if ln.startswith("data:")]
            assert events[-1] == "[DONE]"
            assert "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]).strip()
            t0 = time.monotonic()
            while True:  # both exchanges appended, off the request path
                m = re.search(r'^trawmem_proxy_appends_total\{outcome="stored"\} (\S+)$', c.get("/metrics").text, re.M)
                if m and float(m.group(1)) == 2:
                    break
                assert time.monotonic() - t0 < 300, "the appends never finished"
                time.sleep(0.2)
            assert c.get("/v1/banks/ana-ben").json()["n_units"] == before + 4
