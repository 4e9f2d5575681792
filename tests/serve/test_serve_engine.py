"""`trawmem serve`: the served engine and its refresh, dates reaching the engine, a missing collection
created, and SIGTERM draining with a message.

The real server in-process on 127.0.0.1 and a free port, driven with httpx.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402



# ----------------------------------------------------------------------------------------------
# the served engine and its refresh
# ----------------------------------------------------------------------------------------------
class _FakeBank:
    """Just what the served engine reads of a bank: its id, and no messages (``unit_view`` looks for
    bursts: a bank without any is its own view, this very object)."""

    turns, n_units, thread_offsets = (), 0, np.zeros(1, dtype=np.int64)

    def __init__(self, bank_id, v=0):
        self.bank_id, self.v = bank_id, v


class _Eng:
    def __init__(self, banks, cfg):
        self.banks, self.cfg = {b.bank_id: b for b in banks}, cfg
        self.built, self.published = [], []

    def prepare_bank(self, bank):
        from types import SimpleNamespace

        self.built.append(bank.bank_id)
        return SimpleNamespace(bank=bank), {}

    def replace_bank(self, bank, prepared=None):
        if prepared is None:
            self.built.append(bank.bank_id)
        self.published.append(bank.bank_id)
        self.banks[bank.bank_id] = bank


def test_served_engine_refresh():
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.memory.engines import ServedEngine

    es = ServedEngine({}, SelectConfig(), make=_Eng)
    assert es.builds == 0 and es.prepare(_FakeBank("a")) is None
    with pytest.raises(LookupError):
        es.engine
    a, b = _FakeBank("a"), _FakeBank("b")
    es.refresh(a)  # the first bank builds the engine
    es.refresh(b)  # later ones join it in place
    eng = es.engine
    assert es.builds == 1 and eng.banks == {"a": a, "b": b} and es.bank("b") is b
    # prepared off the worker: refresh only publishes; tables prepared for another bank object are not used
    eng.built.clear()
    b2 = _FakeBank("b", 2)
    prep = es.prepare(b2)
    assert eng.built == ["b"]
    es.refresh(b2, prep)
    assert eng.built == ["b"] and eng.banks["b"] is b2 and eng.published[-1] == "b"
    eng.built.clear()
    b3 = _FakeBank("b", 3)
    es.refresh(b3, prep)  # prepared for b2: ignored, b3 is built
    assert eng.built == ["b"] and eng.banks["b"] is b3 and es.builds == 1


def test_dates_reach_the_engine():
    """The engine client hands each request's date to the engine (none at all: None), and says
    per request whether its date was used."""
    from datetime import datetime

    import numpy as np

    from trawmem_gpu.select import client

    class Eng:
        bank_ids = ["a", "b"]

        def select_units(self, bank_ids, questions, Z, dates=None, params=None):
            self.dates, self.params = dates, params
            return [[1]] * len(bank_ids)

        def view(self, bank_id):
            return bank_id

    d = [datetime(2031, 1, 2), None]
    eng = Eng()
    z = np.zeros(2, dtype=np.float32)
    got = client.select(client.Bare(eng), [client.Request(b, "q", "p", z, date=x) for b, x in zip("ab", d)])
    assert [(g.units, g.dated, g.bank) for g in got] == [([1], True, "a"), ([1], False, "b")] and eng.dates == d
    got = client.select(client.Bare(eng), [client.Request("a", "q", "p", z)])
    assert [(g.units, g.dated) for g in got] == [([1], False)] and eng.dates is None
    assert eng.params == ["p"]


def test_serve_creates_a_missing_collection_and_sigterm_drains_with_a_message(tmp_path):
    """`serve --collection NEW` does what its help says (creates it) and says so; SIGTERM says
    it drains, answers what it holds, and the process exits 0 with a last line."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    new = tmp_path / "typo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(new),
                             "--port", str(port), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300 and proc.poll() is None:  # bounded wait for readiness
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/banks", timeout=30).json()["banks"] == []
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "0 banks, 0 units" in out and "1 banks" not in out
    assert f"{new} did not exist: created an empty collection there" in out
    assert "SIGTERM: draining" in out and out.rstrip().endswith("trawmem serve: stopped"), out
    assert (new / "collection.json").exists()
