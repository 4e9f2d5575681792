"""Helpers of the serve tests: a sample collection on disk and the real server on a free port."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

SAMPLE_BANK = "ana-ben"
KEYS = {"rw": "key-acme-rw-0123456789", "ro": "key-acme-ro-0123456789", "other": "key-other-rw-0123456789"}
"""API keys of the tenant tests: acme read-write and read-only (banks ``acme-*``), and another
tenant (``other-*`` and the sample bank)."""


def keys_file(path: Path) -> str:
    """A keys file of :data:`KEYS` at ``path`` (``ServeConfig.keys_file``)."""
    import hashlib
    import json

    h = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    path.write_text(json.dumps({"keys": [
        {"sha256": h(KEYS["rw"]), "tenant": "acme", "banks": ["acme-*"], "access": "read-write"},
        {"sha256": h(KEYS["ro"]), "tenant": "acme-reader", "banks": ["acme-*"], "access": "read-only"},
        {"sha256": h(KEYS["other"]), "tenant": "other", "banks": ["other-*", SAMPLE_BANK], "access": "read-write"},
    ]}))
    return str(path)


def build_sample_collection(path: Path, extra_ids: tuple[str, ...] = ()) -> Path:
    """The bundled sample conversation as bank ``ana-ben`` (and copies under ``extra_ids``)."""
    from dataclasses import replace

    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.data import load_conversations, sample_path
    from trawmem_gpu.store import Collection

    convs = load_conversations(sample_path())
    convs += [replace(convs[0], bank_id=b) for b in extra_ids]
    banks, _ = build_banks(convs, progress=False)
    coll = Collection(path, create=True)
    for b in banks:
        coll.put(b)
    return path


def copy_collection(src: Path, dst: Path) -> str:
    shutil.copytree(src, dst)
    return str(dst)


NO_DEADLINE_S = 600.0
"""The per-query deadline of the tests' servers (``ServeConfig.timeout_s``; the default 10 s is
reached on a machine whose cores are all busy, issue 42.9): a test of the deadline sets its own."""


@contextmanager
def running(cfg, **service_kw):
    """(url, service, app) of a real server for ``cfg`` on 127.0.0.1 and a free port; a ``cfg`` with
    the default per-query deadline gets :data:`NO_DEADLINE_S` instead."""
    from dataclasses import fields, replace

    from trawmem_gpu.serve.server import BackgroundServer, build_app

    default = next(f.default for f in fields(cfg) if f.name == "timeout_s")
    if cfg.timeout_s == default:
        cfg = replace(cfg, timeout_s=NO_DEADLINE_S)
    app, service = build_app(cfg, **service_kw)
    with BackgroundServer(app, cfg) as srv:
        yield srv.url, service, srv


def serve_command(coll, *args: str, env: dict | None = None, bound_s: float = 300.0):
    """``trawmem serve --collection coll --port 0 --threads 1 *args`` in a subprocess, once its
    ``/readyz`` answers 200: ``(process, url, output lines)``. The output is read on a thread for the
    process's life (``lines`` grows; ``process.reader``, the thread, ends with the output), so a
    chatty server never blocks on a full pipe. ``bound_s``
    bounds a hang (the test fails with the output), it is not a timing assertion."""
    import os
    import re
    import subprocess
    import sys
    import threading
    import time

    import httpx
    import pytest

    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(coll),
                             "--port", "0", "--threads", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    lines: list[str] = []
    proc.reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    proc.reader.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s and proc.poll() is None:
        urls = [m.group(1) for ln in list(lines) for m in [re.search(r"(http://127\.0\.0\.1:\d+)", ln)] if m]
        if urls:
            try:
                if httpx.get(urls[0] + "/readyz", timeout=2).status_code == 200:
                    return proc, urls[0], lines
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    pytest.fail("server did not start:\n" + "".join(lines))


def stop_serve(proc, wait_s: float = 120.0) -> None:
    """SIGTERM to a :func:`serve_command` process (its drain), SIGKILL if it has not exited within
    ``wait_s`` (a bound on a hang)."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
