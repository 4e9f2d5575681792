"""Append-only, resumable JSON Lines output with exactly-once ids across restarts.

* **One writer.** The file is locked (``filelock``, a maintained cross-platform lock library)
  for the lifetime of the writer; a second writer fails at once with a clear error. The lock
  (and the sidecar) belong to the real file, the path with every symlink resolved, so two
  paths that reach one file through a link take the same lock.
* **No half lines read.** Each batch of records goes to the file in one ``os.write`` of complete
  lines followed by ``fsync``, and is acknowledged only after it. A batch can still be torn: a
  power cut, or a SIGKILL during a write of more than a page (Linux stops a write between pages
  for a fatal signal). On open, an unterminated last line is detected, reported
  (``torn_bytes``) and cut off before anything is appended; readers skip it; a rerun writes the
  torn batch's records again.
* **Resumable.** On open, every complete line is parsed and its id remembered; the job skips
  those ids, so a rerun writes only what is missing. A corrupt complete line or a duplicate id
  is an error naming the line, never silently dropped.
* **Same job.** A sidecar ``<file>.meta.json`` records the job's configuration; resuming with a
  different configuration is refused unless ``overwrite`` (which starts the file afresh).
* **Same content.** The fields named by ``keep`` of every written record are kept in
  ``written`` (id -> fields), so the job can compare each record with its input (the question,
  the bank digest, the config: see ``score.resume.resume_todo``), not only its id. ``drop(ids)``
  takes records out again (to score them anew), by an atomic rewrite of the file under the lock.

What an output holds, once written: :func:`summarize_output` (its metrics) and
:func:`answer_failures` (answers a rerun will retry).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import InputError, loads_json, read_json_object


class ResumableJsonl:
    """Open (or create) ``path`` for appending records keyed by ``key``.

    :param meta: the job configuration; stored beside the file, and compared on resume
    :param overwrite: discard an existing file (and its sidecar) instead of resuming it
    :param keep: fields of each written record to keep in ``written`` for the caller's checks
    """

    def __init__(self, path: str | Path, *, key: str = "id", meta: dict | None = None, overwrite: bool = False,
                 keep: tuple[str, ...] = ()):
        from filelock import FileLock, Timeout

        self.path = Path(path).resolve()  # the real file: a symlinked --out shares its lock
        self.key = key
        self.keep = tuple(keep)
        self.written: dict[str, dict] = {}
        """id -> the ``keep`` fields of its written record."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path) + ".lock")
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise InputError(f"{self.path}: another process is writing this file (lock {self._lock.lock_file}); "
                             "wait for it or choose another `out`") from None
        try:
            self.meta_path = self.path.with_name(self.path.name + ".meta.json")
            if overwrite:
                self.path.unlink(missing_ok=True)
                self.meta_path.unlink(missing_ok=True)
            self.torn_bytes = 0
            self.ids: set[str] = set()
            self._scan()
            self._check_meta(meta)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except BaseException:
            self._lock.release()
            raise

    def _scan(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # an unterminated last line: a write torn by a crash
            self.torn_bytes = len(data) - end
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        for ln, line in enumerate(data[:end].split(b"\n")[:-1], 1):
            if not line.strip():
                continue
            try:
                rec = loads_json(line)
                rid = rec[self.key]
            except (ValueError, KeyError, TypeError) as e:  # ValueError: malformed, not UTF-8, too deep
                raise InputError(f"{self.path}:{ln}: corrupt record ({type(e).__name__}); the file was not written "
                                 "by `trawmem score` alone: repair it or use `overwrite`") from None
            if str(rid) in self.ids:
                raise InputError(f"{self.path}:{ln}: duplicate {self.key} {rid!r}")
            self.ids.add(str(rid))
            if self.keep:
                self.written[str(rid)] = {k: rec.get(k) for k in self.keep}

    def _check_meta(self, meta: dict | None) -> None:
        if meta is None:
            return
        if self.meta_path.exists() and self.ids:
            try:  # damaged: which job wrote the records cannot be told, so they are not resumed
                old = read_json_object(self.meta_path, str(self.meta_path), "damaged sidecar")
            except InputError as e:
                raise InputError(f"{self.path} holds {len(self.ids)} records, and {e}, which records the job that "
                                 "wrote them; use `overwrite` or another `out`") from None
            if old != json.loads(json.dumps(meta)):
                diff = sorted(k for k in set(meta) | set(old) if old.get(k) != meta.get(k))
                raise InputError(f"{self.path} holds {len(self.ids)} records of a job with another configuration "
                                 f"(differs in {', '.join(diff) or 'format'}); use `overwrite` or another `out`")
        tmp = self.meta_path.with_name(self.meta_path.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.meta_path)

    def __contains__(self, rid: str) -> bool:
        return rid in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def write_many(self, records: list[dict]) -> None:
        """Append ``records`` (each with a new id) as whole lines, then fsync."""
        if not records:
            return
        new = [str(r[self.key]) for r in records]
        dup = [i for i in new if i in self.ids]
        if dup or len(set(new)) != len(new):
            raise ValueError(f"{self.path}: {self.key} {(dup or new)[0]!r} is already written")
        buf = b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in records)
        view = memoryview(buf)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        self.ids.update(new)

    def drop(self, ids) -> int:
        """Take the records of ``ids`` out of the file (an atomic rewrite, fsynced, under the
        lock this writer holds); returns how many went. A kill leaves the old file or the new."""
        ids = {str(i) for i in ids} & self.ids
        if not ids:
            return 0
        data = self.path.read_bytes()
        keep = []
        for line in data[: data.rfind(b"\n") + 1].split(b"\n"):
            if line.strip() and str(loads_json(line)[self.key]) not in ids:
                keep.append(line + b"\n")
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(b"".join(keep))
            f.flush()
            os.fsync(f.fileno())
        os.close(self._fd)
        self._fd = None
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.ids -= ids
        for i in ids:
            self.written.pop(i, None)
        return len(ids)

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock.is_locked:
            self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_records(path: str | Path) -> list[dict]:
    """All complete records of a JSONL output (an unterminated last line is ignored)."""
    data = Path(path).read_bytes()
    data = data[: data.rfind(b"\n") + 1]
    return [loads_json(x) for x in data.split(b"\n") if x.strip()]


def answer_failures(out: str | Path) -> int:
    """Records of ``out`` whose answer request failed (``answer_error``): a rerun retries them."""
    return sum(1 for r in read_records(out) if r.get("answer_error"))


def summarize_output(out: str | Path) -> dict | None:
    """Aggregate the ``eval`` of every record in ``out`` (official and evidence metrics)."""
    from ..eval.longmemeval import aggregate_lme

    evals = [r["eval"] for r in read_records(out) if "eval" in r]
    return aggregate_lme(evals) if evals else None
