"""`trawmem serve` listens before it says its URL (issue 42.10): while the collection and the
encoder load, `/healthz` answers 200, `/readyz` 503 with what is loading, other routes 503 with
`Retry-After`; a client that connects as soon as the URL line appears gets an answer, never a
refused connection."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def test_serve_answers_as_soon_as_it_says_its_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(tmp_path / "c"),
                             "--port", str(port), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        while proc.poll() is None:
            lines.append(proc.stdout.readline())
            if url in lines[-1]:
                break
        assert url in lines[-1], lines
        ready = httpx.get(f"{url}/readyz", timeout=60)  # at once: an answer, not a refused connection
        assert ready.status_code in (200, 503)
        assert httpx.get(f"{url}/healthz", timeout=60).status_code == 200
        banks = httpx.get(f"{url}/v1/banks", timeout=60)
        if banks.status_code == 503:  # still loading: says so, and when to come back
            assert banks.headers["retry-after"] == "1" and "not ready" in banks.json()["detail"]
        if ready.status_code == 503:
            assert "not ready" in ready.json()["detail"]
        for _ in range(3000):  # bounded: until the collection and encoder are loaded and warm
            if httpx.get(f"{url}/readyz", timeout=60).status_code == 200:
                break
            time.sleep(0.1)
        assert httpx.get(f"{url}/v1/banks", timeout=60).json()["banks"] == []
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert proc.returncode == 0, out
    assert "0 banks, 0 units" in out and out.rstrip().endswith("trawmem serve: stopped"), out
