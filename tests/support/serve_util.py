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
