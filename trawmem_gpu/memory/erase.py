"""Erasure of forgotten turns from every copy outside the bank files.

What a forget must reach besides the bank (see ``docs/python-api.md``, "Forgetting"):

* the **embedding caches** (``embeddings.sqlite``: key = sha256 of encoder id, query flag and
  text; value = the float32 vector): rows whose key is the key of a forgotten text (the turn's
  embedded text, its words, a removed thread head; as a document and as a query), and rows
  whose vector is the vector of a forgotten unit or removed head, whatever their key. Files a
  damaged cache was set aside as (``embeddings.sqlite.bad-N``) are removed;
* the **LLM response caches** (``llm.sqlite``): rows whose response quotes a forgotten text
  (their keys are hashes of the prompts, which are not stored);
* the **score outputs** named by the caller: records of the bank that picked a forgotten turn
  (or, for a whole bank, every record of it) are taken out (a rerun of ``score`` scores them
  again against the bank as it now is).

SQLite keeps deleted rows in free pages and, in WAL mode, in the log: every delete runs with
``secure_delete`` on, then ``VACUUM`` rewrites the file and a ``TRUNCATE`` checkpoint empties
the log, so no byte of a deleted row is left in the files.

A forget records what it erases in a journal (``DIR/.forget/<sha1 of the bank id>.json``, written
before the bank is rewritten, removed when every copy is erased), so a forget killed half-way is
finished by the next forget of that bank (``Memory.forget`` reruns it first).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..encode.cache import EmbeddingCache
from ..paths import default_cache_dir
from ..store.bank import Bank
from ..store.files import fsync_dir, write_json_atomic

JOURNAL_DIR = ".forget"


@dataclass
class Erasure:
    """What one forget erases (JSON-serializable: the journal's content)."""

    bank_id: str
    turn_ids: list[str]
    """Forgotten turn ids (all of the bank's for a whole-bank forget)."""
    whole: bool
    """The whole bank goes."""
    texts: list[str] = field(default_factory=list)
    """Forgotten texts: the turns' words, captions and embedded texts, removed heads."""
    keys: list[str] = field(default_factory=list)
    """Embedding-cache keys of those texts."""
    vectors: list[str] = field(default_factory=list)
    """sha256 of the float32 bytes of the forgotten unit vectors and removed head vectors."""
    dirname: str | None = None
    """The bank's directory under ``banks/`` (a whole-bank forget removes it)."""

    @classmethod
    def of(cls, old: Bank, new: Bank | None, turn_ids, dirname: str | None = None) -> "Erasure":
        """The erasure of going from ``old`` to ``new`` (None: the bank is gone)."""
        drop = set(turn_ids) if new is not None else {t.turn_id for t in old.turns}
        idx = [i for i, t in enumerate(old.turns) if t.turn_id in drop]
        kept_heads = set() if new is None else set(new.heads)
        gone = [j for j, h in enumerate(old.heads) if h not in kept_heads]
        texts = []
        for i in idx:
            t = old.turns[i]
            texts += [t.text, t.embed_text(), t.lexical_text()] + ([t.caption] if t.caption else [])
        texts += [old.heads[j] for j in gone]
        texts = [x for x in dict.fromkeys(texts) if x]
        keys = [EmbeddingCache.key(old.encoder_id, q, x) for x in texts for q in (False, True)]
        vecs = [old.unit_vecs[i] for i in idx] + [old.head_vecs[j] for j in gone]
        return cls(old.bank_id, [old.turns[i].turn_id for i in idx], new is None, texts, keys,
                   [vector_digest(v) for v in vecs], dirname)

    def merged(self, other: "Erasure | None") -> "Erasure":
        if other is None:
            return self
        u = lambda a, b: list(dict.fromkeys(a + b))  # noqa: E731
        return Erasure(self.bank_id, u(other.turn_ids, self.turn_ids), self.whole or other.whole,
                       u(other.texts, self.texts), u(other.keys, self.keys), u(other.vectors, self.vectors),
                       self.dirname or other.dirname)


def vector_digest(v) -> str:
    return hashlib.sha256(np.ascontiguousarray(v, dtype=np.float32).tobytes()).hexdigest()


# -- the journal ---------------------------------------------------------------------------------
def journal_path(collection: str | Path, bank_id: str) -> Path:
    name = hashlib.sha1(bank_id.encode("utf-8", "surrogatepass")).hexdigest()
    return Path(collection) / JOURNAL_DIR / f"{name}.json"


def read_journal(collection, bank_id: str) -> Erasure | None:
    p = journal_path(collection, bank_id)
    try:
        return Erasure(**json.loads(p.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):  # a torn journal: written atomically, so never; be safe
        return None


def pending_journals(collection) -> list[Erasure]:
    d = Path(collection) / JOURNAL_DIR
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(Erasure(**json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue
    return out


def write_journal(collection, e: Erasure) -> None:
    p = journal_path(collection, e.bank_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(asdict(e.merged(read_journal(collection, e.bank_id))), p)


def clear_journal(collection, bank_id: str) -> None:
    p = journal_path(collection, bank_id)
    p.unlink(missing_ok=True)
    for tmp in p.parent.glob(f".{p.name}.tmp-*") if p.parent.is_dir() else []:
        tmp.unlink(missing_ok=True)
    fsync_dir(p.parent) if p.parent.is_dir() else None


# -- caches ---------------------------------------------------------------------------------------
def default_caches() -> list[Path]:
    """The caches every forget scrubs: the default embedding and LLM caches (``TRAWMEM_CACHE``)."""
    root = default_cache_dir()
    return [root / "embeddings.sqlite", root / "llm.sqlite"]


def _scrub_db(path: Path, delete) -> int:
    """Run ``delete(db) -> rows`` on the sqlite file ``path`` with secure_delete, then rewrite the
    file (VACUUM) and empty its log; returns the rows deleted (0 when there is no such file)."""
    if not path.exists():
        return 0
    db = sqlite3.connect(str(path), timeout=60, isolation_level=None)
    try:
        db.execute("PRAGMA secure_delete=ON")
        db.create_function("sha256", 1, lambda b: hashlib.sha256(b).hexdigest() if isinstance(b, bytes) else None,
                           deterministic=True)
        db.execute("BEGIN IMMEDIATE")
        try:
            n = delete(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("VACUUM")
        if db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return n
    finally:
        db.close()


def _tables(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def scrub_embeddings(path: Path, e: Erasure) -> int:
    """Delete the erasure's rows from the embedding cache ``path`` (by key and by vector)."""
    def delete(db):
        if "emb" not in _tables(db):
            return 0
        n = 0
        for s in range(0, len(e.keys), 500):
            chunk = e.keys[s:s + 500]
            n += db.execute(f"DELETE FROM emb WHERE k IN ({','.join('?' * len(chunk))})", chunk).rowcount
        if e.vectors:
            db.execute("CREATE TEMP TABLE gone (h TEXT PRIMARY KEY)")
            db.executemany("INSERT OR IGNORE INTO gone VALUES (?)", [(h,) for h in e.vectors])
            n += db.execute("DELETE FROM emb WHERE sha256(v) IN (SELECT h FROM gone)").rowcount
            db.execute("DROP TABLE gone")
        return n
    n = _scrub_db(path, delete)
    for bad in path.parent.glob(f"{path.name}.bad-*") if path.parent.is_dir() else []:
        bad.unlink(missing_ok=True)  # a damaged cache set aside: it may hold the vectors too
    return n


def scrub_llm(path: Path, e: Erasure) -> int:
    """Delete the LLM responses that quote a forgotten text from the response cache ``path``."""
    def delete(db):
        if "responses" not in _tables(db):
            return 0
        n = 0
        for x in e.texts:
            n += db.execute("DELETE FROM responses WHERE instr(text, ?) > 0", (x,)).rowcount
        return n
    return _scrub_db(path, delete)


def scrub_cache(path: Path, e: Erasure) -> int:
    """Scrub one cache file, an embedding or an LLM cache (told apart by its tables)."""
    path = Path(path)
    if not path.exists():
        return 0
    db = sqlite3.connect(str(path), timeout=60)
    try:
        tables = _tables(db)
    finally:
        db.close()
    n = scrub_embeddings(path, e) if "emb" in tables else 0
    return n + (scrub_llm(path, e) if "responses" in tables else 0)


def scrub_outputs(paths, e: Erasure) -> int:
    """Take out of each ``score`` output (JSONL) the records of the erasure's bank that picked a
    forgotten turn (every record of the bank for a whole bank) or quote a forgotten text."""
    from ..score.writer import ResumableJsonl

    gone, n = set(e.turn_ids), 0
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        ids = []
        for line in p.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "id" not in rec:
                continue
            text = json.dumps(rec, ensure_ascii=False)
            mine = rec.get("bank_id") == e.bank_id
            if (mine and (e.whole or gone & set(rec.get("units") or ()))) or any(x in text for x in e.texts):
                ids.append(rec["id"])
        if ids:
            w = ResumableJsonl(p)
            try:
                n += w.drop(ids)
            finally:
                w.close()
        for tmp in p.parent.glob(f".{p.name}.tmp-*"):
            tmp.unlink(missing_ok=True)
    return n


def erase_copies(e: Erasure, caches=(), outputs=()) -> dict:
    """Scrub every cache (the defaults and ``caches``) and the ``outputs``; returns the counts."""
    files = list(dict.fromkeys([*default_caches(), *map(Path, caches)]))
    rows = sum(scrub_cache(p, e) for p in files)
    return {"cache_rows": rows, "output_records": scrub_outputs(outputs, e) if outputs else 0}

