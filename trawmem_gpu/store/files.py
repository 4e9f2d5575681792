"""Banks on disk: a directory of safetensors tensors plus JSON metadata, written atomically.

Layout of a bank directory::

    tensors.safetensors   unit_vecs, head_vecs, thread_offsets, edge_src/dst/w/kind
    units.json            one record per unit (id, speaker, text, session, date, caption)
    meta.json             format version, bank id, encoder id, build config, heads, counts,
                          and the sha256 of the two files above (written last)

A bank is written into a temporary sibling directory and renamed into place, so a killed
build leaves either the old bank or none, never a half-written one that loads. Loading checks
the format version and both checksums.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np

from ..data.types import Turn
from ..errors import BankError
from .bank import Bank

FORMAT_VERSION = 1
TENSORS, UNITS, META = "tensors.safetensors", "units.json", "meta.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _turn_record(t: Turn) -> dict:
    return {"id": t.turn_id, "speaker": t.speaker, "text": t.text, "session": t.session,
            "timestamp": t.timestamp, "time": t.time.isoformat() if t.time else None, "caption": t.caption}


def _turn_from(r: dict) -> Turn:
    return Turn(r["id"], r["speaker"], r["text"], int(r["session"]), r["timestamp"],
                datetime.fromisoformat(r["time"]) if r.get("time") else None, r.get("caption"))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - not every filesystem allows it
        pass


def write_bank_files(bank: Bank, d: Path) -> None:
    """Write the three files of ``bank`` into the existing directory ``d`` (not atomic by itself)."""
    from safetensors.numpy import save_file

    bank.validate()
    tensors = {
        "unit_vecs": np.ascontiguousarray(bank.unit_vecs, dtype=np.float32),
        "head_vecs": np.ascontiguousarray(bank.head_vecs, dtype=np.float32),
        "thread_offsets": np.ascontiguousarray(bank.thread_offsets, dtype=np.int64),
        "edge_src": np.ascontiguousarray(bank.edge_src, dtype=np.int64),
        "edge_dst": np.ascontiguousarray(bank.edge_dst, dtype=np.int64),
        "edge_w": np.ascontiguousarray(bank.edge_w, dtype=np.float32),
        "edge_kind": np.ascontiguousarray(bank.edge_kind, dtype=np.int8),
    }
    save_file(tensors, str(d / TENSORS))
    with open(d / UNITS, "w", encoding="utf-8") as f:
        json.dump([_turn_record(t) for t in bank.turns], f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    meta = {
        "format_version": FORMAT_VERSION,
        "bank_id": bank.bank_id,
        "encoder_id": bank.encoder_id,
        "dim": int(bank.unit_vecs.shape[1]),
        "n_units": bank.n_units,
        "n_threads": bank.n_threads,
        "n_edges": int(len(bank.edge_src)),
        "heads": bank.heads,
        "head_kind": bank.head_kind,
        "build_config": bank.build_config,
        "stats": bank.stats,
        "checksums": {TENSORS: _sha256(d / TENSORS), UNITS: _sha256(d / UNITS)},
    }
    tmp = d / (META + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / META)


def save_bank(bank: Bank, path: str | Path) -> Path:
    """Atomically (re)place the bank directory at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_bank_files(bank, tmp)
        _fsync_dir(tmp)
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not path.exists():  # failed between the two renames
            os.replace(old, path)
        raise
    return path


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    mp = path / META
    if not path.is_dir():
        olds = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []
        hint = f" (a write killed mid-swap left the previous bank at {olds[0]}; rename it back)" if olds else ""
        raise BankError(f"{path}: no bank directory here{hint}")
    if not mp.exists():
        raise BankError(f"{path}: not a bank (missing {META}; an interrupted write leaves no valid bank)")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BankError(f"{mp}: corrupt metadata ({e})") from None
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise BankError(f"{mp}: corrupt metadata (no format_version)")
    if meta["format_version"] != FORMAT_VERSION:
        raise BankError(f"{path}: bank format version {meta['format_version']!r}, this trawmem_gpu reads "
                        f"version {FORMAT_VERSION}; rebuild the bank with `trawmem build`")
    return meta


def load_bank(path: str | Path, *, verify: bool = True) -> Bank:
    """Load and check a bank directory; any corruption raises ``BankError`` naming the file."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    meta = read_meta(path)
    try:
        sums = meta["checksums"]
        for name in (TENSORS, UNITS):
            fp = path / name
            if not fp.exists():
                raise BankError(f"{fp}: missing")
            if verify and _sha256(fp) != sums[name]:
                raise BankError(f"{fp}: checksum mismatch (corrupt or truncated file)")
        try:
            t = load_file(str(path / TENSORS))
        except (SafetensorError, OSError, ValueError) as e:
            raise BankError(f"{path / TENSORS}: unreadable tensors ({e})") from None
        units = json.loads((path / UNITS).read_text(encoding="utf-8"))
        bank = Bank(
            bank_id=meta["bank_id"], turns=[_turn_from(r) for r in units],
            thread_offsets=t["thread_offsets"], heads=list(meta["heads"]), head_kind=list(meta["head_kind"]),
            unit_vecs=t["unit_vecs"], head_vecs=t["head_vecs"], edge_src=t["edge_src"], edge_dst=t["edge_dst"],
            edge_w=t["edge_w"], edge_kind=t["edge_kind"], encoder_id=meta["encoder_id"],
            build_config=meta.get("build_config", {}), stats=meta.get("stats", {}))
    except BankError:
        raise
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise BankError(f"{path}: corrupt bank ({type(e).__name__}: {e})") from None
    try:
        bank.validate()
    except ValueError as e:
        raise BankError(f"{path}: {e}") from None
    return bank
