"""`trawmem serve` listens before it says its URL (issue 42.10): while the collection and the
encoder load, `/healthz` answers 200, `/readyz` 503 with what is loading, other routes 503 with
`Retry-After`; a client that connects as soon as the URL line appears gets an answer, never a
refused connection. In one process, and with `--http-workers` (fronts up first, the engine
process loading behind them: its load held by the test until it has seen the loading answers)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from serve_util import SAMPLE_BANK, build_sample_collection


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


GATED_SERVE = """
import os, sys, time


def main():
    from trawmem_gpu.serve import service

    gate, argv = sys.argv[1], sys.argv[2:]
    init = service.SelectionService.__init__

    def gated(self, *a, **kw):  # the engine's load waits until the test creates the gate file (bounded)
        for _ in range(6000):
            if os.path.exists(gate):
                break
            time.sleep(0.1)
        init(self, *a, **kw)

    service.SelectionService.__init__ = gated
    from trawmem_gpu.cli import main as trawmem

    return trawmem(argv)


if __name__ == "__main__":  # not in the spawned fronts, which import this file as __mp_main__
    sys.exit(main())
"""


def test_http_workers_listen_and_answer_503_while_the_engine_loads(tmp_path):
    """`--http-workers 2` once loaded the collection before it started its fronts and said its URL
    (connections refused meanwhile). Now the URL comes once the fronts answer, before the load:
    with the engine's load held, `/healthz` is 200 and `/readyz`, selects and bank reads are 503
    "not ready: loading ..." with `Retry-After`, on every front and at once (none hangs); once the
    load is let go, the same connection gets 200s, and the server stops cleanly."""
    coll = build_sample_collection(tmp_path / "coll")
    script, gate = tmp_path / "gated_serve.py", tmp_path / "gate"
    script.write_text(GATED_SERVE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, str(script), str(gate), "serve", "--collection", str(coll),
                             "--port", str(port), "--http-workers", "2", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    question = {"bank_id": SAMPLE_BANK, "question": "Where does Clara live now?"}
    try:
        lines = []
        while proc.poll() is None:
            lines.append(proc.stdout.readline())
            if url in lines[-1]:
                break
        assert url in lines[-1], lines
        assert not any(" bank" in line and " unit" in line for line in lines), lines  # not loaded yet
        with httpx.Client(base_url=url, timeout=120) as c:
            assert c.get("/healthz").status_code == 200
            answers = [c.get("/readyz"), c.post("/v1/select", json=question), c.get("/v1/banks"),
                       c.get(f"/v1/banks/{SAMPLE_BANK}")]
            for r in answers:
                assert r.status_code == 503, r.text
                assert r.json()["detail"] == "not ready: loading the collection and the query encoder", r.text
            assert [r.headers.get("retry-after") for r in answers] == [None, "1", "1", "1"]
            for _ in range(8):  # new connections, spread over both fronts: each answers 503 at once
                with httpx.Client(base_url=url, timeout=120) as fresh:
                    assert fresh.post("/v1/select", json=question).status_code == 503
            gate.touch()  # let the engine load
            for _ in range(3000):  # bounded: until loaded and warm
                if c.get("/readyz").status_code == 200:
                    break
                time.sleep(0.1)
            r = c.post("/v1/select", json=question)  # the same keep-alive connection
            assert r.status_code == 200 and r.json()["units"], r.text
            assert c.get(f"/v1/banks/{SAMPLE_BANK}").json()["bank_id"] == SAMPLE_BANK
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert proc.returncode == 0, out
    assert out.index("HTTP front processes") < out.index(url) < out.index("1 bank, "), out
    assert out.rstrip().endswith("trawmem serve: stopped"), out


def test_http_workers_a_load_that_fails_stops_the_fronts_with_its_error(tmp_path):
    """The fronts now start before the engine loads: a load that fails (an unknown encoder) still
    ends the command with its error (exit 2, the ConfigError's message) and leaves no front behind."""
    import re
    from pathlib import Path

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(tmp_path / "c"),
                           "--port", "0", "--http-workers", "1", "--threads", "1", "--encoder", "no-such/encoder"],
                          capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "error: unknown encoder 'no-such/encoder'" in out, out
    assert "Traceback" not in out, out
    fronts = [int(p) for p in re.search(r"pids ([0-9, ]+)\)", out).group(1).split(", ")]

    def alive(pid: int) -> bool:
        try:
            return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
        except OSError:
            return False

    for _ in range(600):  # bounded: the fronts were stopped before the command returned
        if not any(alive(p) for p in fronts):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"front processes {fronts} outlived the command")
