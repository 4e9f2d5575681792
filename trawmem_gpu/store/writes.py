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
import queue
import shutil
import threading
import time
from pathlib import Path

from .bank import Bank
from .records import PAUSE_ENV, pause_point  # noqa: F401 - PAUSE_ENV: imported from here too
from .files import FORMAT_VERSION, META, fsync_dir, load_bank, read_meta, stored_files, write_base, write_json_atomic
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


def update(coll, bank_id: str, fn, tries: int):
    """``Collection.update`` (see there): the stored bank (the one ``coll`` last loaded or wrote when
    it is still that revision), ``fn`` of it, then the write, as a segment when it extends it."""
    from ..errors import BankError
    from .segments import extends

    with coll.bank_lock(bank_id):
        for _ in range(tries):
            with coll.lock(reading=True):
                coll.refresh()
                meta = coll._meta(bank_id)
                rev = None if meta is None else meta.get("meta_sha256", "unreadable")
                old = None
                if rev is not None:
                    old = coll._cached(bank_id, rev)
                    if old is None:
                        path = coll.bank_path(bank_id)
                        old = load_bank(path, bank_id=bank_id)
                        coll._remember(bank_id, rev, old)
            new = fn(old)
            if new is not None and new.bank_id != bank_id:
                raise BankError(f"update of bank {bank_id!r} returned bank {new.bank_id!r}")
            if new is not None and old is not None and meta.get("format_version") == FORMAT_VERSION \
                    and extends(new, old):
                if append_segment(coll, bank_id, meta, new):
                    return new
                continue  # another writer's put landed meanwhile: apply fn to its bank
            with coll.lock():
                coll._refuse_lost_index()
                coll.refresh()
                if coll._revision(bank_id) != rev:
                    continue  # another writer's put landed meanwhile: apply fn to its bank
                if new is not None:
                    coll._sweep()
                    coll._write([new])
                return new
    raise BankError(f"{coll.path}: bank {bank_id!r} kept changing under {tries} attempts to update it")


def append_segment(coll, bank_id: str, meta: dict, new: Bank) -> bool:
    """Write ``new`` (which extends the bank stored as ``meta``) as a segment of ``bank_id`` and
    commit it; False, with nothing committed, when the stored bank changed meanwhile (call with the
    bank lock held)."""
    d = coll.path / "banks" / coll.banks[bank_id]
    name = f"seg-{int(meta.get('segment_counter', 0)):06d}"
    entry, sums = write_segment(d, new, name)
    pause_point("segment-written")
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
    policy = coll.compaction
    if policy is not None and policy.due(m):
        if policy.background:
            coll.compactor().submit(bank_id)
        else:
            compact(coll, bank_id)
    return True


def sweep(coll) -> None:
    """Clean up after killed writers (call with the collection lock held): temporary index files
    and bank directories go, a compaction's private directory goes once no compaction of its bank
    runs, and a bank a write killed between its two renames left aside comes back."""
    for tmp in coll.path.glob(".collection.json.tmp-*"):
        tmp.unlink(missing_ok=True)
    bdir = coll.path / "banks"
    if not bdir.is_dir():
        return
    for p in bdir.iterdir():
        if not p.name.startswith("."):
            continue
        if ".tmp-" in p.name:
            shutil.rmtree(p, ignore_errors=True)
        elif COMPACT in p.name:
            name = p.name[1:p.name.index(COMPACT)]
            bid = next((b for b, n in coll.banks.items() if n == name), None)
            if bid is None:
                shutil.rmtree(p, ignore_errors=True)
            else:
                remove_compactions(bdir, name, False, coll, bid, found=[p])
        elif ".old-" in p.name:
            live = bdir / p.name[1:p.name.rindex(".old-")]
            if not live.exists() and live.name in coll.banks.values():
                os.replace(p, live)  # killed between the two renames: the previous bank comes back
            else:
                shutil.rmtree(p, ignore_errors=True)


def restore(live: Path) -> None:
    """Put back the bank a write killed between its two renames left aside (call under the lock)."""
    olds = sorted(live.parent.glob(f".{live.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if olds:
        try:
            os.replace(olds[-1], live)
        except OSError:  # a read-only collection: the load says what is missing
            pass


def compaction_dir(bdir: Path, dirname: str) -> Path:
    """The private directory of a compaction of the bank in ``bdir / dirname``: one name per bank
    (compactions of a bank take its compaction lock, one at a time), so finding it is one ``stat``,
    not a listing of a directory that holds every bank of the collection. Earlier releases named it
    with a random suffix; ``sweep`` still finds those (any name holding ``COMPACT``)."""
    return bdir / f".{dirname}{COMPACT}w"


def remove_compactions(bdir: Path, dirname: str, force: bool, coll=None, bank_id: str | None = None,
                       found: list[Path] | None = None) -> None:
    """Remove the private directories of compactions of the bank in ``bdir / dirname``
    (``found``, a listing's, else :func:`compaction_dir`): all of them with ``force`` (a rewrite of
    the bank: a copy of what it drops must not outlive it; a live compactor then fails), else only
    when no compaction of ``bank_id`` runs (a killed one's)."""
    for p in (found if found is not None else [compaction_dir(bdir, dirname)]):
        if not p.exists():
            continue
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
        tmp = None
        try:
            # the private directory is made under the same lock hold as the snapshot is read: a
            # rewrite of the bank (a forget) that commits after it removes it, and every later
            # write into it fails; one that committed before it is what gets compacted
            with coll.lock(reading=True):
                coll.refresh()
                d = coll.bank_path(bank_id)
                meta = read_meta(d)
                if meta["format_version"] < 3 or not meta["segments"]:
                    return False
                tmp = compaction_dir(d.parent, d.name)
                shutil.rmtree(tmp, ignore_errors=True)  # a killed compaction's (this lock is ours)
                tmp.mkdir()
                bank = coll._cached(bank_id, meta["meta_sha256"]) or load_bank(d, bank_id=bank_id)
            base = write_base(bank, tmp, int(meta["base"].get("generation", 0)) + 1)
            fsync_dir(tmp)
            pause_point("compact-written")
            return _commit(coll, bank_id, d, meta, base, tmp, bank)
        finally:
            if tmp is not None:
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
        pause_point("compact-moved")
        new = compact_meta(cur, merged, base)
        write_json_atomic(new, d / META, indent=1)
        pause_point("compact-committed")
        remove_files(d / n for n in set(stored_files(cur)) - set(stored_files(new)))
        fsync_dir(d)
        if cur["meta_sha256"] == meta["meta_sha256"]:
            coll._remember(bank_id, new["meta_sha256"], bank)
    log.info("compacted bank %r: %d segments merged into base generation %d", bank_id, merged,
             base["generation"])
    return True


class Compactor:
    """A daemon thread that compacts the banks handed to it (``Collection.compactor``), one at a
    time; a bank queued twice is compacted once. A failure is logged and leaves the bank as it was
    (every compaction that does not commit does). The thread ends when its queue is empty and the
    next :meth:`submit` starts another: an idle collection holds no thread, and a thread never
    keeps a dropped collection (and the banks it caches) alive."""

    def __init__(self, coll):
        self.coll = coll
        self._queue: queue.Queue = queue.Queue()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.done = 0
        """Compactions committed."""

    def submit(self, bank_id: str) -> None:
        with self._lock:
            if bank_id in self._pending:
                return
            self._pending.add(bank_id)
            self._queue.put(bank_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trawmem-compact", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:  # an empty queue ends the thread; submit starts the next under this lock
                try:
                    bank_id = self._queue.get_nowait()
                except queue.Empty:
                    self._thread = None
                    return
                self._pending.discard(bank_id)
            try:
                self.done += bool(compact(self.coll, bank_id))
            except Exception as e:  # noqa: BLE001 - the bank stays as it was; the next append retries
                log.warning("compaction of bank %r failed: %s: %s", bank_id, type(e).__name__, e)
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        """Return once every compaction handed over so far has finished."""
        self._queue.join()
