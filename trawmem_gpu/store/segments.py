"""Appends as segments: a write that costs what it changes, and the compaction that merges them.

An append (``ingest.update_bank``) keeps the bank's first ``keep_threads`` threads and adds turns,
threads and nearest-head rows after them; the bank it returns says so (``Bank.extends``, an
:class:`Extension`). The store writes only that, as one segment beside the bank's files:

    seg-NNNNNN.safetensors   unit_vecs [k, d] of the new turns; head_vecs [a, d] and
                             thread_starts [a] (unit offsets in the whole bank) of the threads
                             from ``keep_threads`` on; knn_rows [r] (thread ids) with knn_sims /
                             knn_ids [r, k]: every row of the nearest-head table the append changed
    seg-NNNNNN.json          {"turns": [turn records], "heads": [...], "head_kind": [...]}

and lists it in ``meta.json`` (its entry: name, ``keep_threads``, counts, the digest of its turns;
its files' sha256 under ``checksums``). Both files are written and fsynced first, then the directory,
then ``meta.json`` is replaced atomically: that rename is the commit. A kill before it leaves the
bank as it was (the unlisted files are overwritten by the next append, or swept); after it, the
segment is part of the bank. Loading applies the segments in order over the base
(:func:`apply_segments`) and derives the edges from the final nearest-head table.

Compaction (:func:`compact_meta` and ``Collection.compact``) writes the whole bank as of some
revision as the base's next generation (``tensors-G.safetensors``, ...) into a private directory,
without holding the bank's lock; then, under the locks, it moves those files in and replaces
``meta.json`` with one whose base is the new generation and whose segments are those appended
since (they extend the bank the new base holds). Old base files and merged segments are removed
after the commit. A kill at any point leaves either the old ``meta.json`` (old base, every
segment) or the new one; leftovers are swept.
"""
from __future__ import annotations

import json
import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.types import turns_digest
from ..errors import BankError, loads_json
from ..paths import file_sha256
from .bank import Bank
from .layers import LAYERS, layer_fields
from .records import segment_names

SEGMENT = re.compile(r"seg-\d{6}")


@dataclass(frozen=True)
class CompactionPolicy:
    """When a bank's segments are merged into a new base (``Collection.compact``)."""

    max_segments: int = 16
    """Compact once a bank has this many segments (each costs a file pair to open and apply on load)."""
    max_fraction: float = 0.25
    """...or once its segments hold this fraction of the base's units (or more)."""
    background: bool = True
    """Compact on a background thread of the process that appended (else in the append's call)."""

    def due(self, meta: dict) -> bool:
        """Whether the bank stored as ``meta`` should be compacted now."""
        segs = meta.get("segments") or ()
        units = sum(int(s["n_units"]) for s in segs)
        base = int(meta.get("base", {}).get("n_units", 0))
        return bool(segs) and (len(segs) >= self.max_segments or units >= self.max_fraction * max(base, 1))


@dataclass(frozen=True, eq=False)
class Extension:
    """What an appended bank adds to the bank it was computed from (held weakly: a bank never
    keeps the versions before it alive)."""

    base_ref: "weakref.ref"
    base_units: int
    """Units of the bank it extends: the new bank's turns from here on are new."""
    keep_threads: int
    """Threads of the base the new bank keeps as they are; its threads from here on are new."""
    knn_rows: np.ndarray
    """Kept threads (ids below ``keep_threads``) whose nearest-head rows changed."""

    @classmethod
    def of(cls, base: Bank, keep_threads: int, knn_rows) -> "Extension":
        return cls(weakref.ref(base), base.n_units, int(keep_threads), np.asarray(knn_rows, dtype=np.int64))

    @property
    def base(self) -> Bank | None:
        """The bank it extends (None once nothing else holds it)."""
        return self.base_ref()


def extends(new: Bank, old: Bank) -> bool:
    """Whether ``new`` can be stored as a segment over ``old``: it extends that very bank, with
    the same config, encoder and layers (a change of those is a rewrite)."""
    ext = new.extends
    return (isinstance(ext, Extension) and old is not None and ext.base is old
            and new.build_config == old.build_config
            and new.encoder_id == old.encoder_id and new.knn_ids is not None
            and all(x.items(new) is x.items(old) for x in LAYERS)
            and new.layer_sources == old.layer_sources)


def write_segment(d: Path, new: Bank, name: str) -> tuple[dict, dict]:
    """Write ``new``'s segment (over ``new.extends.base``) as ``name`` into the bank directory
    ``d``, fsynced (the directory too); returns its ``meta.json`` entry and its files' checksums.
    Not committed: the caller replaces ``meta.json``."""
    from safetensors.numpy import save_file

    from .records import _fsync_file, _fsync_write, fsync_dir, turn_record

    ext: Extension = new.extends
    n0, k0, J = ext.base_units, ext.keep_threads, new.n_threads
    new.validate_stored(since=(n0, k0))
    rows = np.union1d(np.asarray(ext.knn_rows, dtype=np.int64), np.arange(k0, J, dtype=np.int64))
    c = np.ascontiguousarray
    tensors = {"unit_vecs": c(new.unit_vecs[n0:], dtype=np.float32), "head_vecs": c(new.head_vecs[k0:], dtype=np.float32),
               "thread_starts": c(new.thread_offsets[k0:J], dtype=np.int64), "knn_rows": c(rows, dtype=np.int64),
               "knn_sims": c(new.knn_sims[rows], dtype=np.float32), "knn_ids": c(new.knn_ids[rows], dtype=np.int64)}
    tf, jf = segment_names(name)
    save_file(tensors, str(d / tf))
    _fsync_file(d / tf)
    turns = new.turns[n0:]
    _fsync_write(d / jf, lambda f: json.dump({"turns": [turn_record(t) for t in turns], "heads": new.heads[k0:],
                                              "head_kind": new.head_kind[k0:]}, f, ensure_ascii=False))
    fsync_dir(d)
    entry = {"name": name, "keep_threads": int(k0), "n_units": len(turns), "n_threads": int(J - k0),
             "knn_rows": int(len(rows)), "turns_sha256": turns_digest(turns)}
    return entry, {tf: file_sha256(d / tf), jf: file_sha256(d / jf)}


def appended_meta(meta: dict, new: Bank, entry: dict, sums: dict) -> dict:
    """``meta`` (the stored bank's, format 3) with the segment ``entry`` appended: the metadata of ``new``."""
    from .records import meta_digest, summary

    m = {k: v for k, v in meta.items() if k != "meta_sha256"}
    m.update(summary=summary(new.turns[new.extends.base_units:], meta.get("summary")), n_units=new.n_units,
             n_threads=new.n_threads, n_edges=int(len(new.edge_src)),
             segments=[*meta["segments"], entry], segment_counter=int(meta.get("segment_counter", 0)) + 1,
             checksums={**meta["checksums"], **sums}, stats=new.stats)
    m["meta_sha256"] = meta_digest(m)
    return m


def apply_segments(bank: Bank, d: Path, segments: list[dict]) -> Bank:
    """The bank of the base ``bank`` (as loaded) and the ``segments`` of ``meta.json`` in order
    (their files' checksums checked by the caller); raises ``BankError`` naming a bad segment file."""
    from .arrays import read_tensors
    from .records import turn_from
    from .graph import edges_from_knn, knn_table
    from .turn_columns import appended

    k = int((bank.build_config or {}).get("knn", 5))
    turns, vec_parts = bank.turns, [bank.unit_vecs]  # columns stay columns: the segments' turns are a tail
    starts = np.asarray(bank.thread_offsets[:-1], dtype=np.int64)
    heads, kinds, hv = list(bank.heads), list(bank.head_kind), np.asarray(bank.head_vecs)
    sims, ids = (bank.knn_sims, bank.knn_ids) if bank.knn_ids is not None else knn_table(hv, k)
    for s in segments:
        tf, jf = segment_names(s["name"])
        try:
            t = read_tensors(d / tf)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
            raise BankError(f"{d / tf}: unreadable tensors ({e})") from None
        rec = loads_json((d / jf).read_text(encoding="utf-8"))
        new_turns = [turn_from(r) for r in rec["turns"]]
        if turns_digest(new_turns) != s["turns_sha256"] or len(new_turns) != s["n_units"]:
            raise BankError(f"{d / jf}: the turns do not match the digest in meta.json")
        k0 = int(s["keep_threads"])
        if not 0 <= k0 <= len(heads) or len(rec["heads"]) != s["n_threads"] or len(t["head_vecs"]) != s["n_threads"]:
            raise BankError(f"{d / jf}: its threads do not fit the bank below it")
        J = k0 + int(s["n_threads"])
        starts = np.concatenate([starts[:k0], t["thread_starts"]])
        heads, kinds = heads[:k0] + list(rec["heads"]), kinds[:k0] + list(rec["head_kind"])
        hv = np.concatenate([hv[:k0], t["head_vecs"]])
        rows = t["knn_rows"]
        if len(rows) and (rows.min() < 0 or rows.max() >= J) or not set(range(k0, J)) <= set(rows.tolist()):
            raise BankError(f"{d / tf}: its nearest-head rows do not fit the bank")
        sims = np.concatenate([sims[:k0], np.zeros((J - k0, sims.shape[1]), dtype=np.float32)])
        ids = np.concatenate([ids[:k0], np.full((J - k0, ids.shape[1]), -1, dtype=np.int64)])
        sims[rows], ids[rows] = t["knn_sims"], t["knn_ids"]
        turns = appended(turns, new_turns)
        vec_parts.append(t["unit_vecs"])
    thr = float((bank.build_config or {}).get("knn_threshold", 0.5))
    src, dst, w, kind = edges_from_knn(sims, ids, thr)
    return Bank(bank.bank_id, turns, np.concatenate([starts, [len(turns)]]).astype(np.int64), heads, kinds,
                np.concatenate(vec_parts), hv, src, dst, w, kind, bank.encoder_id, bank.build_config, bank.stats,
                layer_sources=bank.layer_sources, knn_sims=sims, knn_ids=ids,
                **layer_fields({x.name: (x.items(bank), x.vecs(bank)) for x in LAYERS}))


def compact_meta(current: dict, merged: int, base: dict) -> dict:
    """``current`` (the stored meta.json) with its first ``merged`` segments replaced by the new
    base ``base`` (:func:`~trawmem_gpu.store.files.write_base`'s part, of the bank those
    segments make); the segments after them stay, in order."""
    from .records import meta_digest

    m = {k: v for k, v in current.items() if k != "meta_sha256"}
    keep = current["segments"][merged:]
    sums = {n: current["checksums"][n] for s in keep for n in segment_names(s["name"])}
    m.update(base={k: v for k, v in base.items() if k not in ("checksums", "turns_sha256", "layers")},
             turns_sha256=base["turns_sha256"], segments=keep, checksums={**base["checksums"], **sums})
    if "layers" in base:
        m["layers"] = base["layers"]
    m["meta_sha256"] = meta_digest(m)
    return m


def orphans(d: Path, meta: dict) -> list[Path]:
    """Files in the bank directory ``d`` that ``meta`` does not name (a killed append's segment,
    a killed compaction's base, a replaced base): safe to remove under the bank's lock."""
    from .records import META, stored_files

    named = set(stored_files(meta)) | {META}
    return [p for p in d.iterdir() if p.is_file() and p.name not in named and not p.name.startswith(f".{META}")]


def remove_files(paths) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
