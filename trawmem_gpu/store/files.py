"""Banks on disk: a directory of safetensors tensors plus JSON metadata, written atomically.

Layout of a bank directory (format version 3)::

    tensors.safetensors   the base: unit_vecs, head_vecs, thread_offsets, edge_src/dst/w/kind,
                          knn_sims / knn_ids (each thread's nearest heads, ``store.graph``)
    units.json            one record per unit (id, speaker, text, session, date, caption; metadata
                          only for a turn that has some: a bank without metadata reads as before)
    threads.json          the threads' heads and head kinds
    layers.json           only in a bank with a layer's items or a layer built: ``{"facts": [...], "profiles":
                          [...], "sources": {...}}``, one list of records per layer (``store.layers``:
                          facts and profiles always, another layer when it has items); their vectors
                          are the tensors each layer names (``fact_vecs``, ``profile_vecs``; a bank
                          without layers has none)
    seg-NNNNNN.safetensors / seg-NNNNNN.json
                          appended segments (``store.segments``): the turns, vectors, threads and
                          nearest-head rows one append added on top of the base and the earlier
                          segments; merged into a new base by a compaction (whose base files carry
                          its generation: ``tensors-G.safetensors``, ...)
    meta.json             format version, bank id, encoder id, build config, counts, the base's
                          file names, its turns_sha256 (the digest of the turns it holds, see
                          ``trawmem_gpu.data.turns_digest``), the segments in order (each with the
                          digest of its turns), the sha256 of every file above, and meta_sha256
                          over all of meta.json except ``stats`` (written last: the commit point)

Everything that affects selection (tensors, turns, heads, build config, bank id, encoder) is
under a checksum; only ``stats`` (build timings, bookkeeping) is not. Loading checks the format
version, every checksum, the turns digests and the structure (``Bank.validate``: duplicate turn
ids, thread tiling, finite vectors, edges); any failure is a ``BankError`` naming the file.
Format 2 (heads in ``meta.json``, no nearest-head table, no segments) is read as well; the next
write of such a bank writes format 3.

A whole bank is written into a uniquely named temporary sibling directory (``.<name>.tmp-*``),
every file fsynced, then renamed into place (the old directory is first renamed aside to
``.<name>.old-*`` and removed after). A killed write leaves either the old bank or the new one,
or, killed between the two renames, the old one aside, which ``Collection`` restores on its
next write or read; it never leaves a half-written bank that loads. An append adds a segment in
place instead (``store.segments``: its files, then ``meta.json``). ``save_bank`` alone takes no
lock: for concurrent writers use ``trawmem_gpu.store.Collection``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from ..data.types import digest_turn, turns_digest
from ..errors import BankError, loads_json
from ..paths import file_sha256
from .bank import Bank
from .layers import LAYERS as LAYER_SPECS, has_layers, layer_fields

from .records import (FORMAT_VERSION, LAYERS, META, READ_VERSIONS, REBUILD_HINT, TENSORS, THREADS, UNITS,  # noqa: F401
                      _fsync_file, _fsync_write, fsync_dir, meta_digest, naive_utc_turns, stored_files, summary,
                      pause_point, turn_from, turn_record, write_json_atomic)

def base_names(gen: int = 0) -> dict:
    """The base's file names in generation ``gen`` (0: a bank as written whole; a compaction's
    base is the next generation, beside the one it replaces until it commits)."""
    names = {"tensors": TENSORS, "units": UNITS, "threads": THREADS, "layers": LAYERS}
    if gen:
        names = {k: f"{n.split('.')[0]}-{gen}.{n.split('.', 1)[1]}" for k, n in names.items()}
    return names


def write_base(bank: Bank, d: Path, gen: int = 0) -> dict:
    """Write ``bank`` as the base files of generation ``gen`` into the existing directory ``d``
    (each fsynced; not atomic by itself) and return the base's part of ``meta.json``."""
    from safetensors.numpy import save_file

    from .graph import knn_table

    bank.validate_stored()
    if bank.is_view:
        raise BankError(f"bank {bank.bank_id!r} is a unit view over {'+'.join(bank.units)}, not a bank; "
                        f"store the bank it was made from")
    k = int((bank.build_config or {}).get("knn", 5))
    sims, ids = (bank.knn_sims, bank.knn_ids) if bank.knn_ids is not None else knn_table(bank.head_vecs, k)
    c = np.ascontiguousarray
    tensors = {
        "unit_vecs": c(bank.unit_vecs, dtype=np.float32), "head_vecs": c(bank.head_vecs, dtype=np.float32),
        "thread_offsets": c(bank.thread_offsets, dtype=np.int64), "edge_src": c(bank.edge_src, dtype=np.int64),
        "edge_dst": c(bank.edge_dst, dtype=np.int64), "edge_w": c(bank.edge_w, dtype=np.float32),
        "edge_kind": c(bank.edge_kind, dtype=np.int8), "knn_sims": c(sims, dtype=np.float32),
        "knn_ids": c(ids, dtype=np.int64),
    }
    names = base_names(gen)
    # a layer built with nothing kept (every LLM fact refused) still records its source: an
    # --update goes on with it
    layered = bool(has_layers(bank) or bank.layer_sources)
    written = [x for x in LAYER_SPECS if x.always or len(x.items(bank))] if layered else []
    for x in LAYER_SPECS:
        if x.vecs(bank) is not None:
            tensors[x.tensor] = c(x.vecs(bank), dtype=np.float32)
    save_file(tensors, str(d / names["tensors"]))
    _fsync_file(d / names["tensors"])
    _fsync_write(d / names["units"], lambda f: json.dump([turn_record(t) for t in bank.turns], f, ensure_ascii=False))
    _fsync_write(d / names["threads"], lambda f: json.dump({"heads": list(bank.heads), "head_kind": list(bank.head_kind)},
                                                           f, ensure_ascii=False))
    if layered:
        _fsync_write(d / names["layers"], lambda f: json.dump(
            {**{x.name: [x.to_record(it) for it in x.items(bank)] for x in written},
             "sources": dict(bank.layer_sources)}, f, ensure_ascii=False))
    else:
        del names["layers"]
    base = {"generation": gen, "files": names, "n_units": bank.n_units, "n_threads": bank.n_threads,
            "turns_sha256": turns_digest(bank.turns),
            "checksums": {n: file_sha256(d / n) for n in names.values()}}
    if layered:
        base["layers"] = {x.name: len(x.items(bank)) for x in written}
    return base


def bank_meta(bank: Bank, base: dict, segments: list | None = None, checksums: dict | None = None,
              counter: int = 0) -> dict:
    """``meta.json`` of ``bank`` stored as the base ``base`` (:func:`write_base`) plus ``segments``
    (their entries, ``store.segments``; ``checksums``: their files'), with its own checksum."""
    segments = list(segments or ())
    meta = {
        "format_version": FORMAT_VERSION,
        "bank_id": bank.bank_id,
        "encoder_id": bank.encoder_id,
        "dim": int(bank.unit_vecs.shape[1]),
        "n_units": bank.n_units,
        "n_threads": bank.n_threads,
        "n_edges": int(len(bank.edge_src)),
        "build_config": bank.build_config,
        "turns_sha256": base["turns_sha256"],
        "summary": summary(bank.turns),
        "stats": bank.stats,
        "base": {k: v for k, v in base.items() if k not in ("checksums", "turns_sha256", "layers")},
        "segments": segments,
        "segment_counter": int(counter),
        "checksums": {**base["checksums"], **(checksums or {})},
    }
    if "layers" in base:
        meta["layers"] = base["layers"]
    meta["meta_sha256"] = meta_digest(meta)
    return meta


def write_bank_files(bank: Bank, d: Path) -> None:
    """Write ``bank`` whole (its base files and ``meta.json``) into the existing directory ``d``
    (not atomic by itself)."""
    write_json_atomic(bank_meta(bank, write_base(bank, d)), d / META, indent=1)


def save_bank(bank: Bank, path: str | Path) -> Path:
    """Atomically (re)place the bank directory at ``path`` (no lock: see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_bank_files(bank, tmp)
        fsync_dir(tmp)
        pause_point("bank-files-written")  # a test's kill point (``records.PAUSE_ENV``)
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
        meta = loads_json(mp.read_text(encoding="utf-8"))
    except ValueError as e:  # malformed, not UTF-8, or nested too deeply
        raise BankError(f"{mp}: corrupt metadata ({e})") from None
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise BankError(f"{mp}: corrupt metadata (no format_version)")
    v = meta["format_version"]
    if not isinstance(v, int) or isinstance(v, bool):
        raise BankError(f"{mp}: corrupt metadata (format_version must be an integer, got {type(v).__name__} {v!r})")
    if v not in READ_VERSIONS:
        raise BankError(f"{path}: bank format version {v}, this trawmem_gpu reads versions "
                        f"{' and '.join(map(str, READ_VERSIONS))}; {REBUILD_HINT}")
    if meta.get("meta_sha256") != meta_digest(meta):
        raise BankError(f"{mp}: checksum mismatch (metadata edited or corrupt); {REBUILD_HINT}")
    return meta


def load_bank(path: str | Path, *, verify: bool = True, bank_id: str | None = None, mmap: bool = False) -> Bank:
    """Load and check a bank directory; any corruption raises ``BankError`` naming the file.

    :param verify: check the sha256 of the tensor and unit files (the metadata is always checked)
    :param bank_id: the id the caller expects (a collection's index entry); another id is an error
    :param mmap: the base's arrays as copy-on-write memory maps of its tensors file (a write to one stays private)
        (``store.arrays.read_tensors``) instead of copies in memory
    """
    from safetensors import SafetensorError

    from .arrays import read_tensors

    path = Path(path)
    meta = read_meta(path)
    try:
        if bank_id is not None and meta["bank_id"] != bank_id:
            raise BankError(f"{path}: holds bank {meta['bank_id']!r} where the collection index expects "
                            f"{bank_id!r} (a copied or moved bank directory?); {REBUILD_HINT}")
        sums = meta["checksums"]
        for name in stored_files(meta):
            fp = path / name
            if not fp.exists():
                raise BankError(f"{fp}: missing")
            if verify and file_sha256(fp) != sums[name]:
                raise BankError(f"{fp}: checksum mismatch (corrupt or truncated file)")
        v2 = meta["format_version"] == 2
        names = {"tensors": TENSORS, "units": UNITS, "layers": LAYERS} if v2 else meta["base"]["files"]
        try:
            t = read_tensors(path / names["tensors"], mmap)
        except (SafetensorError, OSError, ValueError, KeyError, UnicodeDecodeError) as e:
            raise BankError(f"{path / names['tensors']}: unreadable tensors ({e})") from None
        turns, digest = _read_turns(path / names["units"])
        threads = meta if v2 else loads_json((path / names["threads"]).read_text(encoding="utf-8"))
        stats = meta.get("stats", {})
        values, sources = _read_layers(path / names["layers"], meta["layers"], t) if "layers" in meta \
            else ({}, {})
        bank = Bank(
            bank_id=meta["bank_id"], turns=turns,
            thread_offsets=t["thread_offsets"], heads=list(threads["heads"]), head_kind=list(threads["head_kind"]),
            unit_vecs=t["unit_vecs"], head_vecs=t["head_vecs"], edge_src=t["edge_src"], edge_dst=t["edge_dst"],
            edge_w=t["edge_w"], edge_kind=t["edge_kind"], encoder_id=meta["encoder_id"],
            build_config=meta.get("build_config") or {}, stats=stats if isinstance(stats, dict) else {},
            **layer_fields(values), layer_sources=sources, knn_sims=t.get("knn_sims"), knn_ids=t.get("knn_ids"))
        if digest != meta["turns_sha256"]:
            raise BankError(f"{path / names['units']}: the turns do not match the digest in {META}; {REBUILD_HINT}")
        if not v2 and meta["segments"]:
            from .segments import apply_segments

            bank = apply_segments(bank, path, meta["segments"])
        bank.turns = naive_utc_turns(bank.turns)
    except BankError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise BankError(f"{path}: corrupt bank ({type(e).__name__}: {e})") from None
    try:
        bank.validate_stored()
    except (ValueError, TypeError) as e:
        raise BankError(f"{path}: {e}") from None
    return bank


COLUMNS_MIN_TURNS = 32_768
"""A loaded bank of at least this many turns holds them as compact columns (``store.turn_columns``,
~160 B a turn against ~410 B as ``Turn`` objects); a smaller one keeps a list, whose reads cost
~50 ns a turn against the columns' 4-17 us (``benchmarks/results/archive/turn_columns_memory_1e5.json``):
below it the list's extra memory is under 8 MiB, while a filtered select or a unit view reads
every turn."""


def _read_turns(fp: Path):
    """The turns of ``units.json`` (as compact columns, ``store.turn_columns``, from
    :data:`COLUMNS_MIN_TURNS` turns: no ``Turn`` object kept per turn) and the digest of the turns
    as stored (``data.types.turns_digest``, each turn hashed as it is read: aware times as written,
    before the columns store them as naive UTC)."""
    import hashlib

    from .turn_columns import TurnColumns

    from .columns import OutsideColumns

    h = hashlib.sha256()
    records = loads_json(fp.read_text(encoding="utf-8"))
    if not isinstance(records, list) or len(records) < COLUMNS_MIN_TURNS:
        return [digest_turn(h, turn_from(r)) for r in records], h.hexdigest()
    try:
        turns = TurnColumns.of(digest_turn(h, turn_from(r)) for r in records)
    except OutsideColumns:  # a value past the columns (a session past 64 bits): a list, which the
        h = hashlib.sha256()  # bank's checks then refuse as they always have
        turns = [digest_turn(h, turn_from(r)) for r in records]
    del records
    return turns, h.hexdigest()


def _read_layers(fp: Path, counts: dict, tensors: dict) -> tuple[dict, dict]:
    """Each layer's items and vectors (``{name: (items, vecs)}``) and the sources of ``layers.json``
    (checked records, counts as ``meta.json`` says; a layer not written ``always`` may be absent)."""
    rec = loads_json(fp.read_text(encoding="utf-8"))
    required = [x.name for x in LAYER_SPECS if x.always]
    if not isinstance(rec, dict) or not all(isinstance(rec.get(n), list) for n in required):
        raise BankError(f"{fp}: corrupt layers (expected an object with lists "
                        f"{' and '.join(repr(n) for n in required)})")
    unknown = sorted(set(rec) - {x.name for x in LAYER_SPECS} - {"sources"})
    if unknown or not isinstance(counts, dict) or set(counts) - {x.name for x in LAYER_SPECS}:
        raise BankError(f"{fp}: holds layer {(unknown or sorted(counts))[0]!r}, which this trawmem_gpu does not "
                        f"know; {REBUILD_HINT}")
    values = {}
    for x in LAYER_SPECS:
        if x.name not in rec and x.name not in counts:
            continue
        if not isinstance(rec.get(x.name), list):
            raise BankError(f"{fp}: corrupt layers (field {x.name!r} must be a list)")
        try:
            items = tuple(x.from_record(r) for r in rec[x.name])
        except ValueError as e:
            raise BankError(f"{fp}: corrupt layers ({e})") from None
        if len(items) != counts.get(x.name):
            raise BankError(f"{fp}: {len(items)} {x.name} where {META} says {counts.get(x.name)}")
        values[x.name] = (items, tensors.get(x.tensor))
    sources = rec.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise BankError(f"{fp}: corrupt layers (field 'sources' must map layer names to strings)")
    return values, sources
