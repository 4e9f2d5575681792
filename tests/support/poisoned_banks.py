"""A collection whose bank files hold a poisoned value or a damaged file (the quarantine tests)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


BAD = "acme-2"

QUESTION = "Where does Clara live?"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from serve_util import build_sample_collection

    return build_sample_collection(tmp_path_factory.mktemp("base") / "coll", extra_ids=("acme-1", BAD, "other-1"))


def _rewrite_units(bank_dir: Path, change) -> None:
    """Apply ``change`` to the bank's unit records and make every checksum match again."""
    from trawmem_gpu.data.types import turns_digest
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.store.files import META, UNITS, meta_digest, turn_from

    units = json.loads((bank_dir / UNITS).read_text())
    change(units)
    (bank_dir / UNITS).write_text(json.dumps(units))
    meta = json.loads((bank_dir / META).read_text())
    meta["turns_sha256"] = turns_digest([turn_from(r) for r in units])
    meta["checksums"][UNITS] = file_sha256(bank_dir / UNITS)
    meta["meta_sha256"] = meta_digest(meta)
    (bank_dir / META).write_text(json.dumps(meta))


def _last_session(value):
    def change(units):
        last = units[-1]["session"]
        for r in units:
            if r["session"] == last:
                r["session"] = value
    return change


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])

POISONS = {
    # kind: (how it is planted into the bank directory, words the cause names)
    "session 10**30": (lambda d: _rewrite_units(d, _last_session(10 ** 30)), "session 1000000000000000000000000000000"),
    "session 2**63": (lambda d: _rewrite_units(d, _last_session(2 ** 63)), f"session {2 ** 63}"),
    "truncated tensors": (lambda d: _truncate(d / "tensors.safetensors"), "tensors.safetensors: checksum mismatch"),
    "corrupt units": (lambda d: (d / "units.json").write_bytes(b"\x00garbage{"), "units.json: checksum mismatch"),
    "corrupt meta": (lambda d: (d / "meta.json").write_text("{"), "meta.json: corrupt metadata"),
    # JSON nested past the interpreter's recursion limit (issue 42): a clear cause, and still removable
    "nested units": (lambda d: (d / "units.json").write_text("[" * 100_000 + "]" * 100_000), "units.json: checksum mismatch"),
    "nested meta": (lambda d: (d / "meta.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000),
                    "meta.json: corrupt metadata"),
    "missing directory": (lambda d: shutil.rmtree(d), "no bank directory here"),
}


def _poisoned(base: Path, tmp_path: Path, kind: str) -> Path:
    coll = tmp_path / "coll"
    shutil.copytree(base, coll)
    POISONS[kind][0](coll / "banks" / BAD)
    return coll
