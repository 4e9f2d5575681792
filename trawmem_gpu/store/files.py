"""Banks on disk: a directory of safetensors tensors plus JSON metadata, written atomically.

Layout of a bank directory (format version 2)::

    tensors.safetensors   unit_vecs, head_vecs, thread_offsets, edge_src/dst/w/kind
    units.json            one record per unit (id, speaker, text, session, date, caption; metadata
                          only for a turn that has some: a bank without metadata reads as before)
    layers.json           only in a bank with facts, profiles or a layer built: ``{"facts": [...], "profiles":
                          [...]}`` (``store.facts`` records); their vectors are the tensors
                          ``fact_vecs`` / ``profile_vecs`` (a bank without layers has neither, so
                          its files are what they were before layers existed)
    meta.json             format version, bank id, encoder id, build config, heads, counts,
                          turns_sha256 (the digest of the turns the bank holds, see
                          ``trawmem_gpu.data.turns_digest``), the sha256 of the two files above,
                          and meta_sha256 over all of meta.json except ``stats`` (written last)

Everything that affects selection (tensors, turns, heads, build config, bank id, encoder) is
under a checksum; only ``stats`` (build timings, bookkeeping) is not. Loading checks the format
version, all three checksums, the turns digest and the structure (``Bank.validate``: duplicate
turn ids, thread tiling, finite vectors, edges); any failure is a ``BankError`` naming the file.

A bank is written into a uniquely named temporary sibling directory (``.<name>.tmp-*``),
every file fsynced, then renamed into place (the old directory is first renamed aside to
``.<name>.old-*`` and removed after). A killed write leaves either the old bank or the new one,
or, killed between the two renames, the old one aside, which ``Collection`` restores on its
next write; it never leaves a half-written bank that loads. ``save_bank`` alone takes no lock:
for concurrent writers use ``trawmem_gpu.store.Collection``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np

from ..data.dates import naive_utc
from ..data.metadata import Metadata
from ..data.types import Turn, turns_digest
from ..errors import BankError
from ..paths import file_sha256
from .bank import Bank

FORMAT_VERSION = 2
"""Layout version of bank directories and collection indexes; other versions are refused."""
TENSORS, UNITS, META, LAYERS = "tensors.safetensors", "units.json", "meta.json", "layers.json"
REBUILD_HINT = "rebuild it from its history (`trawmem build`, not an `update`)"


def meta_digest(meta: dict) -> str:
    """sha256 of the canonical JSON of ``meta`` without ``meta_sha256`` and ``stats``."""
    body = {k: v for k, v in meta.items() if k not in ("meta_sha256", "stats")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False,
                                     separators=(",", ":")).encode("utf-8")).hexdigest()


def turn_record(t: Turn) -> dict:
    """A turn as the bank files store it (``units.json``; a forget's journal too). ``metadata`` is
    written only for a turn that has some, so a bank without metadata writes the files it wrote
    before metadata existed (and an older reader's banks load unchanged)."""
    r = {"id": t.turn_id, "speaker": t.speaker, "text": t.text, "session": t.session,
         "timestamp": t.timestamp, "time": t.time.isoformat() if t.time else None, "caption": t.caption}
    if t.metadata:
        r["metadata"] = dict(t.metadata)
    return r


def naive_utc_turns(turns: list[Turn]) -> list[Turn]:
    """``turns`` with every timezone-aware ``time`` as the naive UTC time the turn schema stores
    (``data.dates.naive_utc``, the one rule). Banks written before that rule read a ``Z`` or offset
    timestamp as an aware time; they are read as their UTC times (checked against the stored digest
    first), so every bank in memory holds naive times, and the next write stores them naive."""
    if all(t.time is None or t.time.utcoffset() is None for t in turns):
        return turns
    return [t if t.time is None else replace(t, time=naive_utc(t.time)) for t in turns]


def turn_from(r: dict) -> Turn:
    """The turn of a :func:`turn_record` (``ValueError`` for metadata that is not a map)."""
    meta = r.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"turn {r['id']!r}: metadata is not a map")
    return Turn(r["id"], r["speaker"], r["text"], int(r["session"]), r["timestamp"],
                datetime.fromisoformat(r["time"]) if r.get("time") else None, r.get("caption"),
                Metadata(meta) if meta else None)


def fsync_dir(path: Path) -> None:
    """fsync a directory (its entries: renames and new files), where the filesystem allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - not every filesystem allows it
        pass


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(obj, path: Path, **dump_kw) -> None:
    """Write ``obj`` as JSON to a unique temporary sibling, fsync it, rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, **dump_kw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def write_bank_files(bank: Bank, d: Path) -> None:
    """Write the three files of ``bank`` into the existing directory ``d`` (not atomic by itself)."""
    from safetensors.numpy import save_file

    bank.validate_stored()
    if bank.is_view:
        raise BankError(f"bank {bank.bank_id!r} is a unit view over {'+'.join(bank.units)}, not a bank; "
                        f"store the bank it was made from")
    tensors = {
        "unit_vecs": np.ascontiguousarray(bank.unit_vecs, dtype=np.float32),
        "head_vecs": np.ascontiguousarray(bank.head_vecs, dtype=np.float32),
        "thread_offsets": np.ascontiguousarray(bank.thread_offsets, dtype=np.int64),
        "edge_src": np.ascontiguousarray(bank.edge_src, dtype=np.int64),
        "edge_dst": np.ascontiguousarray(bank.edge_dst, dtype=np.int64),
        "edge_w": np.ascontiguousarray(bank.edge_w, dtype=np.float32),
        "edge_kind": np.ascontiguousarray(bank.edge_kind, dtype=np.int8),
    }
    # a layer built with nothing kept (every LLM fact refused) still records its source: an
    # --update goes on with it
    layered = bool(bank.facts or bank.profiles or bank.layer_sources)
    for name in ("fact_vecs", "profile_vecs"):
        if getattr(bank, name) is not None:
            tensors[name] = np.ascontiguousarray(getattr(bank, name), dtype=np.float32)
    save_file(tensors, str(d / TENSORS))
    _fsync_file(d / TENSORS)
    with open(d / UNITS, "w", encoding="utf-8") as f:
        json.dump([turn_record(t) for t in bank.turns], f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    if layered:
        with open(d / LAYERS, "w", encoding="utf-8") as f:
            json.dump({"facts": [x.to_record() for x in bank.facts], "profiles": [x.to_record() for x in bank.profiles],
                       "sources": dict(bank.layer_sources)}, f, ensure_ascii=False)
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
        "turns_sha256": turns_digest(bank.turns),
        "stats": bank.stats,
        "checksums": {TENSORS: file_sha256(d / TENSORS), UNITS: file_sha256(d / UNITS)},
    }
    if layered:
        meta["layers"] = {"facts": len(bank.facts), "profiles": len(bank.profiles)}
        meta["checksums"][LAYERS] = file_sha256(d / LAYERS)
    meta["meta_sha256"] = meta_digest(meta)
    write_json_atomic(meta, d / META, indent=1)


def save_bank(bank: Bank, path: str | Path) -> Path:
    """Atomically (re)place the bank directory at ``path`` (no lock: see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_bank_files(bank, tmp)
        fsync_dir(tmp)
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not path.exists():  # failed between the two renames
            os.replace(old, path)
        raise
    return path


def read_meta(path: str | Path) -> dict:
    """The checked ``meta.json`` of the bank directory ``path`` (format version and meta checksum)."""
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
    v = meta["format_version"]
    if not isinstance(v, int) or isinstance(v, bool):
        raise BankError(f"{mp}: corrupt metadata (format_version must be an integer, got {type(v).__name__} {v!r})")
    if v != FORMAT_VERSION:
        raise BankError(f"{path}: bank format version {v}, this trawmem_gpu reads version {FORMAT_VERSION}; "
                        f"{REBUILD_HINT}")
    if meta.get("meta_sha256") != meta_digest(meta):
        raise BankError(f"{mp}: checksum mismatch (metadata edited or corrupt); {REBUILD_HINT}")
    return meta


def load_bank(path: str | Path, *, verify: bool = True, bank_id: str | None = None) -> Bank:
    """Load and check a bank directory; any corruption raises ``BankError`` naming the file.

    :param verify: check the sha256 of the tensor and unit files (the metadata is always checked)
    :param bank_id: the id the caller expects (a collection's index entry); another id is an error
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    meta = read_meta(path)
    try:
        if bank_id is not None and meta["bank_id"] != bank_id:
            raise BankError(f"{path}: holds bank {meta['bank_id']!r} where the collection index expects "
                            f"{bank_id!r} (a copied or moved bank directory?); {REBUILD_HINT}")
        sums = meta["checksums"]
        layered = "layers" in meta
        for name in (TENSORS, UNITS) + ((LAYERS,) if layered else ()):
            fp = path / name
            if not fp.exists():
                raise BankError(f"{fp}: missing")
            if verify and file_sha256(fp) != sums[name]:
                raise BankError(f"{fp}: checksum mismatch (corrupt or truncated file)")
        try:
            t = load_file(str(path / TENSORS))
        except (SafetensorError, OSError, ValueError) as e:
            raise BankError(f"{path / TENSORS}: unreadable tensors ({e})") from None
        units = json.loads((path / UNITS).read_text(encoding="utf-8"))
        stats = meta.get("stats", {})
        facts, profiles, sources = _read_layers(path / LAYERS, meta["layers"]) if layered else ((), (), {})
        bank = Bank(
            bank_id=meta["bank_id"], turns=[turn_from(r) for r in units],
            thread_offsets=t["thread_offsets"], heads=list(meta["heads"]), head_kind=list(meta["head_kind"]),
            unit_vecs=t["unit_vecs"], head_vecs=t["head_vecs"], edge_src=t["edge_src"], edge_dst=t["edge_dst"],
            edge_w=t["edge_w"], edge_kind=t["edge_kind"], encoder_id=meta["encoder_id"],
            build_config=meta.get("build_config") or {}, stats=stats if isinstance(stats, dict) else {},
            facts=facts, fact_vecs=t.get("fact_vecs"), profiles=profiles, profile_vecs=t.get("profile_vecs"),
            layer_sources=sources)
        if turns_digest(bank.turns) != meta["turns_sha256"]:
            raise BankError(f"{path / UNITS}: the turns do not match the digest in {META}; {REBUILD_HINT}")
        bank.turns = naive_utc_turns(bank.turns)
    except BankError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as e:
        raise BankError(f"{path}: corrupt bank ({type(e).__name__}: {e})") from None
    try:
        bank.validate_stored()
    except (ValueError, TypeError) as e:
        raise BankError(f"{path}: {e}") from None
    return bank


def _read_layers(fp: Path, counts: dict) -> tuple[tuple, tuple, dict]:
    """The facts, profiles and sources of ``layers.json`` (checked records, counts as ``meta.json`` says)."""
    from .facts import fact_from_record, profile_from_record

    rec = json.loads(fp.read_text(encoding="utf-8"))
    if not isinstance(rec, dict) or not isinstance(rec.get("facts"), list) or not isinstance(rec.get("profiles"), list):
        raise BankError(f"{fp}: corrupt layers (expected an object with lists 'facts' and 'profiles')")
    try:
        facts = tuple(fact_from_record(r) for r in rec["facts"])
        profiles = tuple(profile_from_record(r) for r in rec["profiles"])
    except ValueError as e:
        raise BankError(f"{fp}: corrupt layers ({e})") from None
    if len(facts) != counts.get("facts") or len(profiles) != counts.get("profiles"):
        raise BankError(f"{fp}: {len(facts)} facts and {len(profiles)} profile sections where {META} says "
                        f"{counts.get('facts')} and {counts.get('profiles')}")
    sources = rec.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise BankError(f"{fp}: corrupt layers (field 'sources' must map layer names to strings)")
    return facts, profiles, sources
