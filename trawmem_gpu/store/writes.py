"""The two in-place writes of a collection's bank: an appended segment and a compaction.

``Collection.update`` and ``Collection.compact`` call these; the file formats and the crash
argument are ``store.segments``'. Locks (``store.collection``): a bank's compaction lock, then its
bank lock, then the collection lock, never the other way round. An append holds the bank lock
throughout and the collection lock only to commit; a compaction holds only its own lock while it
writes the new base, and takes the other two to move it in and commit.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from .bank import Bank
from .files import META, fsync_dir, load_bank, read_meta, stored_files, write_base, write_json_atomic
from .segments import appended_meta, compact_meta, orphans, remove_files, segment_names, write_segment

log = logging.getLogger(__name__)

COMPACT = ".compact-"
"""Infix of a compaction's private directory beside the bank's (``banks/.<name>.compact-<id>``)."""


@contextlib.contextmanager
def compaction_lock(coll, bank_id: str, wait: float = 0.0):
    """The bank's compaction lock (yields False, holding nothing, when another process or thread
    holds it after ``wait`` seconds)."""
    from filelock import FileLock, Timeout

    name = hashlib.sha1(bank_id.encode("utf-8", "surrogatepass")).hexdigest()
    path = coll.path / ".locks" / f"{name}.compact.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lk = FileLock(str(path), is_singleton=True)
    try:
        lk.acquire(timeout=wait)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lk.release()


def append_segment(coll, bank_id: str, meta: dict, new: Bank) -> bool:
    """Write ``new`` (which extends the bank stored as ``meta``) as a segment of ``bank_id`` and
    commit it; False, with nothing committed, when the stored bank changed meanwhile (call with the
    bank lock held)."""
    d = coll.path / "banks" / coll.banks[bank_id]
    name = f"seg-{int(meta.get('segment_counter', 0)):06d}"
    entry, sums = write_segment(d, new, name)
    with coll.lock():
        coll._refuse_lost_index()
        coll.refresh()
        if coll._revision(bank_id) != meta["meta_sha256"]:
            remove_files(d / n for n in segment_names(name))  # a put landed: its bank, not ours
            return False
        remove_files(p for p in orphans(d, meta) if p.name not in segment_names(name))
        m = appended_meta(meta, new, entry, sums)
        write_json_atomic(m, d / META, indent=1)
    coll._remember(bank_id, m["meta_sha256"], new)
    return True


def remove_compactions(bdir: Path, dirname: str, force: bool, coll=None, bank_id: str | None = None) -> None:
    """Remove the private directories of compactions of the bank in ``bdir / dirname``: all of them
    with ``force`` (a rewrite of the bank: a copy of what it drops must not outlive it; a live
    compactor then fails), else only when no compaction of ``bank_id`` runs (a killed one's)."""
    for p in list(bdir.glob(f".{dirname}{COMPACT}*")):
        if not force:
            with compaction_lock(coll, bank_id) as free:
                if not free:
                    continue
                shutil.rmtree(p, ignore_errors=True)
            continue
        for _ in range(100):  # a compactor may create a file between rmtree's listing and its rmdir
            shutil.rmtree(p, ignore_errors=True)
            if not p.exists():
                break


def compact(coll, bank_id: str) -> bool:
    """Merge the segments of ``bank_id`` into a new base (see ``store.segments``): True when it
    committed; False when there was nothing to merge, another compaction of the bank runs, or a
    write of the bank other than an append landed meanwhile (that write wins)."""
    with compaction_lock(coll, bank_id) as mine:
        if not mine:
            return False
        with coll.lock(reading=True):
            coll.refresh()
            d = coll.bank_path(bank_id)
            meta = read_meta(d)
            if meta["format_version"] < 3 or not meta["segments"]:
                return False
            bank = coll._cached(bank_id, meta["meta_sha256"]) or load_bank(d, bank_id=bank_id)
        tmp = d.parent / f".{d.name}{COMPACT}{uuid.uuid4().hex[:12]}"
        try:
            tmp.mkdir()
            base = write_base(bank, tmp, int(meta["base"].get("generation", 0)) + 1)
            fsync_dir(tmp)
            return _commit(coll, bank_id, d, meta, base, tmp, bank)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _commit(coll, bank_id: str, d: Path, meta: dict, base: dict, tmp: Path, bank: Bank) -> bool:
    """Move the new base in and replace ``meta.json`` under the bank and collection locks, unless
    the bank's base or merged segments changed since ``meta``."""
    merged = len(meta["segments"])
    with coll.bank_lock(bank_id), coll.lock():
        coll.refresh()
        if bank_id not in coll.banks or coll.path / "banks" / coll.banks[bank_id] != d or not d.is_dir():
            return False
        cur = read_meta(d)
        if cur.get("base") != meta["base"] or cur.get("segments", [])[:merged] != meta["segments"]:
            return False
        for n in base["files"].values():
            os.replace(tmp / n, d / n)
        fsync_dir(d)
        new = compact_meta(cur, merged, base)
        write_json_atomic(new, d / META, indent=1)
        remove_files(d / n for n in set(stored_files(cur)) - set(stored_files(new)))
        fsync_dir(d)
        if cur["meta_sha256"] == meta["meta_sha256"]:
            coll._remember(bank_id, new["meta_sha256"], bank)
    log.info("compacted bank %r: %d segments merged into base generation %d", bank_id, merged,
             base["generation"])
    return True
