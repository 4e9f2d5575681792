"""The bank files' shared pieces: names and versions, the record forms of turns and metadata,
fsynced and atomic writes (``store.files`` writes and reads whole banks with them,
``store.segments`` their appended segments)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from ..data.dates import naive_utc
from ..data.metadata import Metadata
from ..data.types import Turn

FORMAT_VERSION = 3
"""Layout version of the bank directories and collection indexes this release writes."""
READ_VERSIONS = (2, 3)
"""Versions this release reads (format 2: no segments, heads in ``meta.json``); others are refused."""
TENSORS, UNITS, META, LAYERS, THREADS = "tensors.safetensors", "units.json", "meta.json", "layers.json", "threads.json"
REBUILD_HINT = "rebuild it from its history (`trawmem build`, not an `update`)"


def meta_digest(meta: dict) -> str:
    """sha256 of the canonical JSON of ``meta`` without ``meta_sha256`` and ``stats``."""
    body = {k: v for k, v in meta.items() if k not in ("meta_sha256", "stats")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False,
                                     separators=(",", ":")).encode("utf-8")).hexdigest()


def turn_record(t: Turn) -> dict:
    """A turn as the bank files store it (``units.json``, a segment's turns; a forget's journal
    too). ``metadata`` is written only for a turn that has some, so a bank without metadata writes
    the files it wrote before metadata existed (and an older reader's banks load unchanged);
    ``stored_at`` only for a turn that has it (one stored before the field existed has none)."""
    r = {"id": t.turn_id, "speaker": t.speaker, "text": t.text, "session": t.session,
         "timestamp": t.timestamp, "time": t.time.isoformat() if t.time else None, "caption": t.caption}
    if t.metadata:
        r["metadata"] = dict(t.metadata)
    if t.stored_at is not None:
        r["stored_at"] = t.stored_at
    return r


def utc_now() -> str:
    """Now, as the naive ISO 8601 UTC string of ``Turn.stored_at`` and the history's event times."""
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat()


def stamped(turns: list[Turn], at: str | None = None, kept: dict | None = None) -> list[Turn]:
    """``turns`` (new to their bank) with ``stored_at`` set: ``kept[turn_id]`` for a turn ``kept``
    names (an import restoring an export's, None where the export had none), else ``at``
    (default: now, once for the whole write). The one place a turn's ``stored_at`` is set, called
    by the doors that store new turns (``Memory.add`` through ``memory.banks``, ``trawmem build``
    and ``--update``) just before the bank is computed; a turn's ``stored_at`` given by a caller
    is never read (the record fields refuse it)."""
    at = at or utc_now()
    kept = kept or {}
    return [replace(t, stored_at=kept[t.turn_id] if t.turn_id in kept else at) for t in turns]


def naive_utc_turns(turns: list[Turn]) -> list[Turn]:
    """``turns`` with every timezone-aware ``time`` as the naive UTC time the turn schema stores
    (``data.dates.naive_utc``, the one rule). Banks written before that rule read a ``Z`` or offset
    timestamp as an aware time; they are read as their UTC times (checked against the stored digest
    first), so every bank in memory holds naive times, and the next write stores them naive."""
    from .columns import OutsideColumns
    from .turn_columns import TurnColumns

    if isinstance(turns, TurnColumns):  # its rows are naive; its tail is made rows too
        try:
            return TurnColumns.of(turns)
        except OutsideColumns:  # a tail's value past the columns: a list (``Bank.validate`` refuses it)
            turns = list(turns)
    if all(t.time is None or t.time.utcoffset() is None for t in turns):
        return turns
    return [t if t.time is None else replace(t, time=naive_utc(t.time)) for t in turns]


def turn_from(r: dict) -> Turn:
    """The turn of a :func:`turn_record` (``ValueError`` for metadata that is not a map, or a
    ``stored_at`` that is not a string); a record without ``stored_at`` (written before it
    existed) reads as None."""
    meta = r.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"turn {r['id']!r}: metadata is not a map")
    at = r.get("stored_at")
    if at is not None and not isinstance(at, str):
        raise ValueError(f"turn {r['id']!r}: stored_at is not a string")
    return Turn(r["id"], r["speaker"], r["text"], int(r["session"]), r["timestamp"],
                datetime.fromisoformat(r["time"]) if r.get("time") else None, r.get("caption"),
                Metadata(meta) if meta else None, at)


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
    write_atomic(path, lambda f: json.dump(obj, f, ensure_ascii=False, **dump_kw))


def write_atomic(path: Path, write) -> None:
    """Write ``path`` whole with ``write(f)`` (a text file) through a unique temporary sibling
    (``.<name>.tmp-*``), fsynced, renamed over it; the directory is fsynced after."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
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


def _fsync_write(path: Path, write) -> None:
    """Create ``path`` with ``write(f)`` (text), flushed and fsynced."""
    with open(path, "w", encoding="utf-8") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def segment_names(name: str) -> tuple[str, str]:
    """The two files of segment ``name`` (``store.segments``)."""
    return f"{name}.safetensors", f"{name}.json"


def summary(turns, prev: dict | None = None) -> dict:
    """A bank's sessions and date range for a listing without loading it (``meta.json``'s
    ``summary``): from its turns, or ``prev`` (the summary of the turns before) and the turns
    appended after them (an append never goes back a session)."""
    prev = prev or {"n_sessions": 0, "last_session": None, "first_date": None, "last_date": None}
    n, last = int(prev["n_sessions"]), prev["last_session"]
    first, latest = prev["first_date"], prev["last_date"]
    for t in turns:
        if t.session != last:
            n, last = n + 1, t.session
        if t.time is not None:
            iso = naive_utc(t.time).isoformat()
            first = iso if first is None or iso < first else first
            latest = iso if latest is None or iso > latest else latest
    return {"n_sessions": n, "last_session": last, "first_date": first, "last_date": latest}


def stored_files(meta: dict) -> list[str]:
    """Every file ``meta`` names (the base's, then each segment's), in the order they are read."""
    if meta["format_version"] == 2:
        return [TENSORS, UNITS] + ([LAYERS] if "layers" in meta else [])
    return list(meta["base"]["files"].values()) + [n for s in meta["segments"] for n in segment_names(s["name"])]


PAUSE_ENV = "TRAWMEM_STORE_PAUSE"
"""Test hook: ``STAGE:FILE`` makes a write that reaches ``STAGE`` create ``FILE`` and wait there,
so a test can kill it at that point. Stages: ``segment-written`` (an append's segment files are
written, ``meta.json`` not yet), ``compact-written`` (a compaction's new base is written in its
private directory), ``compact-moved`` (moved into the bank's directory, ``meta.json`` not yet
replaced), ``compact-committed`` (replaced; the old files not yet removed), ``bank-files-written``
(a whole bank's files are written in a temporary directory, not renamed into place), ``bank-saved``
(renamed into place, the index not yet written: a new bank is not in the collection),
``import-committed`` (an import's bank is written, its history not yet rewritten: ``memory.export``)."""


def pause_point(stage: str) -> None:
    spec = os.environ.get(PAUSE_ENV, "")
    if spec.partition(":")[0] == stage:
        Path(spec.partition(":")[2]).write_text(stage)
        time.sleep(600)
