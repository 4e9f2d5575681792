"""Many banks in one directory (their packing into flat tensors for batched engines: ``store.packed``).

Layout: ``DIR/collection.json`` (format version, encoder id, bank id -> directory name, and the
vector storage ``vectors`` when not float32: ``store/vectors.py``), one
bank directory per bank under ``DIR/banks/`` (see ``store/files.py``), and lock files
(``DIR/.trawmem.lock``, ``DIR/.locks/``).

**Bank directory names.** A bank id is any non-empty string; its directory name is the id
itself when that is already a plain lower-case name (``[a-z0-9][a-z0-9._-]*``, at most 80
characters, not ending in ``.``), else a cleaned-up form plus 10 hex digits of the id's
sha1 (``"Ana's chat"`` -> ``ana_s_chat-abe74f08e2``). A name therefore never is ``.`` or
``..``, never holds a path separator, never starts with ``.`` (temporary directories do), and
ids differing only in letter case get different names on case-insensitive file systems.

**Concurrency.** Any number of threads and processes may read and write one collection:

* ``put(bank)`` / ``put_many(banks)`` write (or replace) banks and then the index, holding the
  collection lock (a ``filelock.FileLock``: cross-process, and one holder at a time among the
  threads of one process; re-entrant within a thread) for each group of up to 64 banks. Under
  the lock the index is re-read from disk, so banks that other writers added are kept; each bank
  goes to a uniquely named temporary directory and the index to a uniquely named temporary
  file, each fsynced and renamed into place. Before writing, leftovers of killed writers are
  cleaned: ``banks/.<name>.tmp-*`` directories and index temp files are removed, and a bank
  left aside as ``banks/.<name>.old-*`` by a kill between its two renames is restored (or
  removed when the new one is in place).
* ``update(bank_id, fn)`` is the read-modify-write of one bank (appending turns):
  ``fn(old_bank_or_None) -> new_bank`` runs while the bank's own lock is held, so concurrent
  updates of one bank apply one after another and none is lost, while other banks stay
  readable and writable. The result is stored only if the bank on disk is still the one ``fn``
  saw (a plain ``put`` of that bank may have landed meanwhile); otherwise ``fn`` runs again on
  the new bank, so ``fn`` must be a pure function of its argument. ``fn`` gets the bank this
  object last loaded or wrote when the stored one is still that revision (no reload), and a
  result that extends it (an append: ``store.segments``) is written as a segment, in place, with
  the collection lock held only to commit it; anything else is written whole.
* ``compact(bank_id)`` merges a bank's segments into a new base without holding the bank's lock
  while it writes (``store.segments``); it gives way to any write of the bank that lands meanwhile.
* ``load(bank_id)`` / ``load_all()`` read each bank under the collection lock (briefly), so a
  reader never sees a bank between its two renames. On a read-only collection (no lock file
  can be created) reads go ahead without the lock.
* ``lock()`` and ``bank_lock(bank_id)`` are the two locks as context managers, for callers that
  need a larger critical section. Order: a bank lock before the collection lock, never after.
* **A lost index.** A directory whose ``banks/`` holds bank directories but which has no
  ``collection.json`` is refused (also with ``create=True``), never taken as new: a fresh index
  would list only the new banks and orphan the others. :func:`repair_index` (``trawmem
  repair-index DIR``) rebuilds the index from the banks' own metadata.
* The index is read when the collection is opened; ``refresh()`` re-reads it, and ``load`` of an
  id not yet known re-reads it once, so a long-lived reader (a server) sees banks added by
  other processes.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import weakref
from pathlib import Path
from typing import Callable, Iterator

from ..errors import BankError, UnknownBank, loads_json, name_list
from .bank import Bank
from .packed import PackedCollection, pack_banks  # noqa: F401 - their old home
from .files import FORMAT_VERSION, READ_VERSIONS, load_bank, read_meta, save_bank, write_json_atomic
from .segments import CompactionPolicy
from .vectors import DEFAULT_VECTORS, check_vectors, record_vectors, recorded_vectors
from .writes import Compactor, compact, pause_point, remove_compactions, restore, sweep, update

INDEX = "collection.json"
LOCK = ".trawmem.lock"
LOCK_DIR = ".locks"
BANKS = "banks"
LOCK_TIMEOUT_S = 600.0
"""How long a writer waits for another one before giving up with a ``BankError``."""

_PLAIN = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")
_WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def bank_dirname(bank_id: str, digits: int = 10) -> str:
    """The directory name of ``bank_id`` (see the module docstring): never ``.``/``..``/hidden/nested."""
    if _PLAIN.fullmatch(bank_id) and not bank_id.endswith(".") and bank_id.split(".")[0] not in _WINDOWS_RESERVED:
        return bank_id
    base = re.sub(r"[^a-z0-9._-]+", "_", bank_id.lower()).strip("._-")[:60] or "bank"
    return f"{base}-{hashlib.sha1(bank_id.encode('utf-8', 'surrogatepass')).hexdigest()[:digits]}"


def _free_dirname(path: Path, bank_id: str, taken: set) -> str:
    """A directory name for the new bank ``bank_id`` that ``taken`` (the names in use) lacks."""
    for digits in (10, 40):
        name = bank_dirname(bank_id, digits)
        if name not in taken:
            return name
    raise BankError(f"{path}: no free directory name for bank {bank_id!r}")  # pragma: no cover


def _valid_dirname(name) -> bool:
    return isinstance(name, str) and bool(re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name)) and len(name) <= 120


def _bank_dirs(path: Path) -> list[str]:
    """Names of the bank directories under ``path/banks`` (temporaries and leftovers excluded)."""
    bdir = path / BANKS
    if not bdir.is_dir():
        return []
    return sorted(p.name for p in bdir.iterdir() if p.is_dir() and not p.name.startswith("."))


class Collection:
    """A directory of banks. ``Collection(dir)`` opens one; ``create=True`` also starts a new one
    (nothing is written before the first ``put``) in a new or empty directory, or one that holds
    only JSON files (a tool's sidecar); any other content is refused, so a mistyped ``--out`` never
    fills a home directory. Safe for concurrent writers: see the module docstring."""

    def __init__(self, path: str | Path, *, create: bool = False, timeout: float = LOCK_TIMEOUT_S,
                 vectors: str | None = None):
        self.path = Path(path)
        self.timeout = float(timeout)
        self._asked = None if vectors is None else check_vectors(vectors)  # checked against the index's
        self.banks: dict[str, str] = {}
        """bank id -> directory name under ``banks/``, as of the last read of the index."""
        self.encoder_id: str | None = None
        self.vectors: str = self._asked or DEFAULT_VECTORS
        """The collection's vector storage (``store.vectors``): the index's, fixed at creation."""
        self._index_stat: tuple | None = None
        """(inode, mtime, size) of the index as last read: ``refresh`` skips an unchanged one."""
        self._cache: dict[str, tuple[str, weakref.ref]] = {}
        """bank id -> (revision, the bank this object last loaded or wrote at it), for ``update``."""
        self._prune_at = 4096
        self.compaction: CompactionPolicy | None = None
        """When an append through this object compacts the bank (None: never by itself; a
        ``Memory`` and a server set ``CompactionPolicy()``: in the background)."""
        self._compactor: Compactor | None = None
        if self.path.exists() and not self.path.is_dir():
            raise BankError(f"{self.path}: is a file, not a collection directory")
        if (self.path / INDEX).exists():
            self.refresh()
        elif (self.path / "meta.json").exists():
            raise BankError(f"{self.path} is a single bank, not a collection; open it with load_bank()")
        elif _bank_dirs(self.path):  # a lost index, or another writer's first put under way
            with self.lock(reading=True):  # a put holds the lock from its first bank to the index
                self._refuse_lost_index()
                self.refresh()
        elif not create:
            if not self.path.exists():
                raise BankError(f"{self.path}: does not exist (no collection there)")
            raise BankError(f"{self.path}: not a collection (missing {INDEX})")
        elif self.path.is_dir():
            other = sorted(p.name for p in self.path.iterdir()
                           if p.name not in (BANKS, LOCK, LOCK_DIR) and not p.name.startswith(f".{INDEX}.tmp-")
                           and not (p.suffix == ".json" and p.is_file()))  # a tool's sidecar next to the index
            if other:
                raise BankError(f"{self.path}: exists and is not a collection (it holds {name_list(other)}); "
                                f"choose a new or empty directory")

    # -- index ------------------------------------------------------------------------------
    def _refuse_lost_index(self) -> None:
        """A ``BankError`` when bank directories exist but the index does not (call under the
        lock): a fresh index would orphan them."""
        if (self.path / INDEX).exists():
            return
        orphans = _bank_dirs(self.path)
        if orphans:
            raise BankError(f"{self.path}: the collection index {INDEX} is missing but {BANKS}/ holds "
                            f"{len(orphans)} bank director{'y' if len(orphans) == 1 else 'ies'} "
                            f"({name_list(orphans)}); rebuild the index from the banks' own metadata with "
                            f"`trawmem repair-index {self.path}`")

    def refresh(self) -> None:
        """Re-read the index from disk (banks other writers added since); nothing to read when the
        file is the one read last (same inode, time and size: every write renames a new file in)."""
        ip = self.path / INDEX
        try:
            st = os.stat(ip)
        except FileNotFoundError:
            self.banks, self.encoder_id, self._index_stat, self.vectors = {}, None, None, self._asked or DEFAULT_VECTORS
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._index_stat:
            return
        try:
            idx = loads_json(ip.read_text(encoding="utf-8"))
        except ValueError as e:  # malformed, not UTF-8, or nested too deeply
            raise BankError(f"{ip}: corrupt collection index ({e})") from None
        if not isinstance(idx, dict):
            raise BankError(f"{ip}: corrupt collection index (expected a JSON object, got {type(idx).__name__})")
        vectors = recorded_vectors(idx, ip, self._asked)
        v = idx.get("format_version")
        if not isinstance(v, int) or isinstance(v, bool):
            raise BankError(f"{ip}: corrupt collection index (format_version must be an integer, "
                            f"got {type(v).__name__} {v!r})")
        if v not in READ_VERSIONS:
            raise BankError(f"{ip}: collection format version {v}, this trawmem_gpu reads versions "
                            f"{' and '.join(map(str, READ_VERSIONS))}; rebuild the banks into a new directory (`trawmem build`)")
        banks, enc = idx.get("banks"), idx.get("encoder_id")
        if not isinstance(banks, dict):
            raise BankError(f"{ip}: corrupt collection index (field 'banks' must be an object mapping bank id "
                            f"to directory name, got {type(banks).__name__})")
        bad = [k for k, d in banks.items() if not _valid_dirname(d)]
        if bad:
            raise BankError(f"{ip}: corrupt collection index (bank {bad[0]!r} maps to the directory name "
                            f"{banks[bad[0]]!r}, which is not a plain name under {BANKS}/)")
        if len(set(banks.values())) != len(banks):
            raise BankError(f"{ip}: corrupt collection index (two banks share one directory)")
        if enc is not None and not isinstance(enc, str):
            raise BankError(f"{ip}: corrupt collection index (field 'encoder_id' must be a string)")
        self.banks, self.encoder_id, self._index_stat, self.vectors = dict(banks), enc, stamp, vectors

    def _write_index(self) -> None:
        idx = {"format_version": FORMAT_VERSION, "encoder_id": self.encoder_id, "banks": self.banks}
        write_json_atomic(record_vectors(idx, self.vectors), self.path / INDEX, indent=1)
        self._index_stat = None

    def create_empty(self) -> bool:
        """Write the index of a new, empty collection (opened with ``create=True``), so the
        directory is a collection from now on; False when one is there already."""
        with self.lock():
            self._refuse_lost_index()  # bank directories without an index are not a new collection
            self.refresh()
            if (self.path / INDEX).exists():
                return False
            self._write_index()
            return True

    def __len__(self) -> int:
        return len(self.banks)

    def __contains__(self, bank_id: str) -> bool:
        return bank_id in self.banks

    @property
    def bank_ids(self) -> list[str]:
        return list(self.banks)

    def bank_path(self, bank_id: str) -> Path:
        if bank_id not in self.banks:
            self.refresh()
        if bank_id not in self.banks:
            raise UnknownBank(bank_id, detail=f" in {self.path} (it holds {len(self.banks)}: {name_list(self.banks)})")
        return self.path / BANKS / self.banks[bank_id]

    # -- locks ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, lock_path: Path, what: str, *, reading: bool = False) -> Iterator[None]:
        from filelock import FileLock, Timeout

        lk = None
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            lk = FileLock(str(lock_path), is_singleton=True)
            lk.acquire(timeout=self.timeout)
        except Timeout:
            raise BankError(f"{self.path}: {what} is busy (another writer held {lock_path} for "
                            f"{self.timeout:g}s)") from None
        except OSError as e:
            if not (reading and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)):
                raise BankError(f"{self.path}: cannot take the lock {lock_path} ({e.strerror})") from None
            lk = None  # a read-only collection: nobody writes it through us, read without the lock
        try:
            yield
        finally:
            if lk is not None:
                lk.release()

    def lock(self, *, reading: bool = False):
        """The collection's exclusive lock, as a context manager (re-entrant within a thread)."""
        return self._locked(self.path / LOCK, "the collection", reading=reading)

    def bank_lock(self, bank_id: str):
        """One bank's lock, held across a read-modify-write of that bank (take it before ``lock()``)."""
        name = hashlib.sha1(bank_id.encode("utf-8", "surrogatepass")).hexdigest()
        return self._locked(self.path / LOCK_DIR / f"{name}.lock", f"bank {bank_id!r}")

    # -- reading ----------------------------------------------------------------------------
    def load(self, bank_id: str, *, mmap: bool = False) -> Bank:
        """The bank ``bank_id``, checked (checksums, turns digest, identity against the index);
        ``mmap``: its base vectors memory-mapped (``store.files.load_bank``). A bank left aside by
        a write killed between its two renames is put back first."""
        path = self.bank_path(bank_id)
        with self.lock(reading=True):
            if not path.exists():
                restore(path)  # a bank a write killed between its two renames left aside
            bank = load_bank(path, bank_id=bank_id, mmap=mmap)
            self._remember(bank_id, read_meta(path)["meta_sha256"], bank)
            return bank

    def _cached(self, bank_id: str, revision: str | None) -> Bank | None:
        """The bank this object last loaded or wrote for ``bank_id`` if it is still the stored revision."""
        rev, ref = self._cache.get(bank_id, (None, None))
        return ref() if ref is not None and rev == revision and revision is not None else None

    def _remember(self, bank_id: str, revision: str, bank: Bank) -> None:
        if len(self._cache) > self._prune_at:  # banks let go since (many banks, few in memory) go too
            self._cache = {k: v for k, v in self._cache.items() if v[1]() is not None}
            self._prune_at = max(4096, 2 * len(self._cache))
        self._cache[bank_id] = (revision, weakref.ref(bank))

    def load_all(self) -> list[Bank]:
        return [self.load(b) for b in list(self.banks)]

    # -- writing ----------------------------------------------------------------------------
    def _sweep(self) -> None:  # after killed writers, with the collection lock held
        sweep(self)

    def _revision(self, bank_id: str) -> str | None:
        """The stored bank's metadata checksum (None when it has none): changes with every write."""
        if bank_id not in self.banks:
            return None
        try:
            return read_meta(self.path / BANKS / self.banks[bank_id]).get("meta_sha256")
        except BankError:
            return "unreadable"

    def _write(self, banks: list[Bank]) -> None:
        """Save ``banks`` and, when it changes, the index (call with the collection lock held, after
        ``refresh``)."""
        changed, taken = False, None
        for bank in banks:
            if self.encoder_id is not None and bank.encoder_id != self.encoder_id:
                raise BankError(f"bank {bank.bank_id!r} was encoded with {bank.encoder_id!r}, the collection "
                                f"{self.path} with {self.encoder_id!r}; one collection holds one embedding space")
            name = self.banks.get(bank.bank_id)
            if name is None:  # a new bank: a free name (the names in use gathered once per write)
                taken = set(self.banks.values()) if taken is None else taken
                name = _free_dirname(self.path, bank.bank_id, taken)
                taken.add(name)
            remove_compactions(self.path / BANKS, name, True)  # a compaction's copy goes with the old bank
            save_bank(bank, self.path / BANKS / name)
            self._remember(bank.bank_id, read_meta(self.path / BANKS / name)["meta_sha256"], bank)
            changed |= self.banks.get(bank.bank_id) != name or self.encoder_id != bank.encoder_id
            self.banks[bank.bank_id] = name
            self.encoder_id = bank.encoder_id
        pause_point("bank-saved")
        if changed or not (self.path / INDEX).exists():
            self._write_index()

    def put(self, bank: Bank) -> None:
        """Write (or replace) one bank, then the index, each atomically, under the collection lock
        (other writers' banks are kept)."""
        self.put_many([bank])

    def put_many(self, banks: list[Bank], group: int = 64) -> None:
        """``put`` for many banks: one lock hold, one index write per ``group`` banks."""
        for i in range(0, len(banks), group):
            with self.lock():
                self._refuse_lost_index()
                self.refresh()
                if i == 0:
                    self._sweep()
                self._write(list(banks[i:i + group]))

    def update(self, bank_id: str, fn: Callable[[Bank | None], Bank | None], *, tries: int = 10) -> Bank | None:
        """Read-modify-write of one bank under its lock: ``fn(stored bank, or None when there is
        none)`` returns the bank to store (its id must be ``bank_id``), or None to store nothing.
        Returns what ``fn`` returned. Concurrent updates of one bank run one after another; if a
        ``put`` of the bank lands while ``fn`` runs, ``fn`` runs again on the new bank. A result
        that extends the stored bank (``store.segments.extends``) is written as a segment."""
        return update(self, bank_id, fn, tries)

    def compact(self, bank_id: str) -> bool:
        """Merge the segments of ``bank_id`` into a new base (``store.writes.compact``; True: done)."""
        return compact(self, bank_id)

    def compactor(self) -> Compactor:
        """The background compactor of this object (started on first use)."""
        if self._compactor is None:
            self._compactor = Compactor(self)
        return self._compactor

    def segments(self, bank_id: str) -> list[dict]:
        """The segments the stored bank ``bank_id`` has on top of its base (``meta.json`` entries)."""
        meta = self._meta(bank_id)
        return [] if meta is None else list(meta.get("segments", ()))

    def _meta(self, bank_id: str) -> dict | None:
        """The stored bank's checked metadata (None: the index names no such bank; ``{}``: unreadable)."""
        if bank_id not in self.banks:
            return None
        path = self.path / BANKS / self.banks[bank_id]
        if not path.exists():
            restore(path)  # a bank a write killed between its two renames left aside
        try:
            return read_meta(path)
        except BankError:
            return {}

    def delete(self, bank_id: str, dirname: str | None = None) -> bool:
        """Remove one bank (False when the index does not name it): the index without it is
        written first (atomically; readers see the bank or no bank), then its directory is moved
        to a temporary name and removed, with any leftovers of earlier writes of it. ``dirname``:
        its directory as the index named it, removed even when the index no longer does (a
        delete killed between the two steps)."""
        with self.bank_lock(bank_id), self.lock():
            self._refuse_lost_index()
            self.refresh()
            name = self.banks.pop(bank_id, None)
            if name is not None:
                self._write_index()
            self._sweep()
            orphan = dirname if dirname not in (None, name, *self.banks.values()) and _valid_dirname(dirname) else None
            for n in (x for x in (name, orphan) if x):
                live = self.path / BANKS / n
                remove_compactions(self.path / BANKS, n, True)  # no compaction's copy outlives the bank
                if live.exists():
                    gone = live.with_name(f".{n}.tmp-deleted")
                    os.replace(live, gone)
                    shutil.rmtree(gone)
            return name is not None

