"""Erasure of forgotten turns from every copy outside the bank files.

What a forget must reach besides the bank (see ``docs/python-api.md``, "Forgetting"):

* the **embedding caches** (``embeddings.sqlite``: key = sha256 of encoder id, query flag and
  text; value = the float32 vector): rows whose key is the key of a forgotten text (the turn's
  embedded text, its words, a removed thread head; as a document and as a query), and rows
  whose vector is the vector of a forgotten unit or removed head, whatever their key. Files a
  damaged cache was set aside as (``embeddings.sqlite.bad-N``) are removed;
* the **LLM response caches** (``llm.sqlite``; keys are hashes of the prompts, which are not
  stored): the responses to every segmentation and head request a build of the bank may have
  sent with a forgotten turn in it (the keys are recomputed, for each model in the cache, with
  the retries of a malformed reply), and every response that quotes a forgotten text or a word
  (6 characters or more) that only forgotten turns of the bank use; answer and judge responses
  of ``eval`` / ``score`` go by that second rule (their prompts are not recomputed);
* the **score outputs** named by the caller: records of the bank that picked a forgotten turn
  (or, for a whole bank, every record of it) are taken out (a rerun of ``score`` scores them
  again against the bank as it now is).

SQLite keeps deleted rows in free pages and, in WAL mode, in the log: every delete runs with
``secure_delete`` on, then ``VACUUM`` rewrites the file and a ``TRUNCATE`` checkpoint empties
the log, so no byte of a deleted row is left in the files.

A forget records what it erases in a journal (``DIR/.forget/<sha1 of the bank id>.json``, written
before the bank is rewritten, removed when every copy is erased; it names the score outputs to
scrub too), so a forget killed half-way is finished by the next open of the collection (``Memory``,
``trawmem serve``, ``trawmem forget``: ``MemoryCore.finish_pending``) or the next forget of that
bank, whichever comes first, whether or not the rerun names the outputs again.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..encode.cache import EmbeddingCache
from ..errors import loads_json
from ..paths import default_cache_dir
from ..store.bank import Bank
from ..store.layers import LAYERS
from ..store.files import fsync_dir, turn_from, turn_record, write_json_atomic

JOURNAL_DIR = ".forget"
PAUSE_ENV = "TRAWMEM_FORGET_PAUSE"
"""Test hook: ``STAGE:FILE`` makes a forget that reaches ``STAGE`` (``journaled``: the journal is
written, the bank not yet; ``stored``: the bank is rewritten, the caches not yet scrubbed) create
``FILE`` and wait there, so a test can kill it at that point."""


def pause_point(stage: str) -> None:
    spec = os.environ.get(PAUSE_ENV, "")
    if spec.partition(":")[0] == stage:
        import time

        Path(spec.partition(":")[2]).write_text(stage)
        time.sleep(600)


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
    words: list[str] = field(default_factory=list)
    """Words (lower case, at least :data:`WORD_MIN` characters) of the forgotten turns that no
    remaining turn of the bank uses: an LLM response quoting one is erased (a partial quote)."""
    sessions: list[list[dict]] = field(default_factory=list)
    """The old bank's sessions that held forgotten turns (turn records): the LLM requests any
    build of them may have sent are recomputed from these (:func:`llm_requests`)."""
    outputs: list[str] = field(default_factory=list)
    """The ``score`` outputs the forget was asked to scrub (absolute paths): journaled with the
    rest, so whoever finishes a killed forget scrubs them too."""

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
        vecs = [old.unit_vecs[i] for i in idx] + [old.head_vecs[j] for j in gone]
        for x in LAYERS:  # the layers beside the turns (``store.layers``)
            items, left = x.items(old), _Kept(x.items(new) if new is not None else (), x)
            gone_items = [k for k, it in enumerate(items) if it not in left]
            texts += [x.text(items[k]) for k in gone_items] if x.text is not None else []
            vecs += [x.vecs(old)[k] for k in gone_items]
        texts = [x for x in dict.fromkeys(texts) if x]
        keys = [EmbeddingCache.key(old.encoder_id, q, x) for x in texts for q in (False, True)]
        kept = set() if new is None else {w for t in new.turns for w in _words(t)}
        words = sorted({w for i in idx for w in _words(old.turns[i])} - kept)
        touched = {old.turns[i].session for i in idx}
        sessions: dict[int, list[dict]] = {}
        for t in old.turns:
            if t.session in touched:
                sessions.setdefault(t.session, []).append(turn_record(t))
        return cls(old.bank_id, [old.turns[i].turn_id for i in idx], new is None, texts, keys,
                   [vector_digest(v) for v in vecs], dirname, words, list(sessions.values()))

    def merged(self, other: "Erasure | None") -> "Erasure":
        if other is None:
            return self
        u = lambda a, b: list(dict.fromkeys(a + b))  # noqa: E731
        return Erasure(self.bank_id, u(other.turn_ids, self.turn_ids), self.whole or other.whole,
                       u(other.texts, self.texts), u(other.keys, self.keys), u(other.vectors, self.vectors),
                       self.dirname or other.dirname, u(other.words, self.words),
                       other.sessions + [x for x in self.sessions if x not in other.sessions],
                       u(other.outputs, self.outputs))


class _Kept:
    """The items a new bank kept: the very objects (a rebuild keeps them), or equal ones (the
    same bank loaded again)."""

    def __init__(self, items, layer):
        self.ids = {id(x) for x in items}
        try:
            self.values = set(items)
        except TypeError:  # unhashable records: identity only
            self.values = set()
        self.layer = layer
        self.same = {self._key(x) for x in items}
        """An item kept with other fields (a fact's validity, its successor forgotten) is kept: same id, same text."""

    def _key(self, x):
        return self.layer.unit_id(x), self.layer.text(x) if self.layer.text is not None else None

    def __contains__(self, x) -> bool:
        try:
            return id(x) in self.ids or x in self.values or self._key(x) in self.same
        except TypeError:
            return False


WORD_MIN = 6


def words_of(text: str) -> set[str]:
    """The words of ``text`` (split on white space, outer punctuation stripped, lower case) of at
    least :data:`WORD_MIN` characters."""
    return {w for w in (x.strip(".,;:!?\"'()[]{}<>*`") for x in text.lower().split()) if len(w) >= WORD_MIN}


def _words(t) -> set[str]:
    return words_of(f"{t.text} {t.caption or ''}")


def llm_requests(e: Erasure, max_len: int = 64) -> list[tuple[list[dict], int, dict | None]]:
    """Every first request (messages, max_tokens, reply schema) a build of the erasure's sessions may have
    sent with a forgotten turn in it: segmentation of each prefix of a session (a session grows
    by appends, each re-segments it whole) and a head of each run of turns (a thread) that holds
    a forgotten turn, up to ``max_len`` turns."""
    from ..ingest.llm_threads import build_requests

    gone = set(e.turn_ids)
    segs, threads = [], []
    for recs in e.sessions:
        turns = [turn_from(r) for r in recs]
        hit = [i for i, t in enumerate(turns) if t.turn_id in gone]
        if not hit:
            continue
        segs += [turns[:k] for k in range(hit[0] + 1, len(turns) + 1)]
        runs = {(a, b) for i in hit for a in range(max(0, i - max_len + 1), i + 1)
                for b in range(i + 1, min(len(turns), a + max_len) + 1)}
        threads += [turns[a:b] for a, b in sorted(runs)]
    return build_requests(segs, threads)


def quoted_forms(texts) -> list[str]:
    """``texts`` as written and as a JSON string quotes them (a JSON reply escapes quotes,
    newlines and, with ``ensure_ascii``, every non-ASCII character)."""
    forms = [f for x in texts for f in (x, json.dumps(x)[1:-1], json.dumps(x, ensure_ascii=False)[1:-1])]
    return list(dict.fromkeys(forms))


def vector_digest(v) -> str:
    return hashlib.sha256(np.ascontiguousarray(v, dtype=np.float32).tobytes()).hexdigest()


# -- the journal ---------------------------------------------------------------------------------
def journal_path(collection: str | Path, bank_id: str) -> Path:
    name = hashlib.sha1(bank_id.encode("utf-8", "surrogatepass")).hexdigest()
    return Path(collection) / JOURNAL_DIR / f"{name}.json"


def read_journal(collection, bank_id: str) -> Erasure | None:
    p = journal_path(collection, bank_id)
    try:
        return Erasure(**loads_json(p.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):  # a torn journal: written atomically, so never; be safe
        return None


def pending_journals(collection) -> list[Erasure]:
    """The journals of every unfinished forget in the collection (by bank id)."""
    d = Path(collection) / JOURNAL_DIR
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            e = Erasure(**loads_json(p.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue
        if journal_path(collection, e.bank_id).name == p.name:
            out.append(e)
    return sorted(out, key=lambda e: e.bank_id)


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


def scrub_llm(path: Path, e: Erasure, retries: int = 3) -> int:
    """Delete from the LLM response cache ``path`` the responses to every request that carried a
    forgotten turn (:func:`llm_requests`, for each model and endpoint the cache holds, and the retries of a
    malformed reply), and every response that quotes a forgotten text."""
    from ..llm.cache import cache_key
    from ..llm.prompts import retry_messages

    def delete(db):
        if "responses" not in _tables(db):
            return 0
        n = 0
        cols = {r[1] for r in db.execute("PRAGMA table_info(responses)")}
        who = "model, endpoint" if "endpoint" in cols else "model, NULL"  # format 1: keys without the endpoint
        servers = list(db.execute(f"SELECT DISTINCT {who} FROM responses"))
        for messages, max_tokens, schema in llm_requests(e) if servers else ():
            for (model, endpoint), sent in itertools.product(servers, (schema, None)):  # constrained or not
                conv = messages
                for _ in range(retries + 1):
                    k = cache_key(model, conv, max_tokens, 0.0, True, endpoint, sent)
                    row = db.execute("SELECT text FROM responses WHERE key=?", (k,)).fetchone()
                    if row is None:
                        break
                    n += db.execute("DELETE FROM responses WHERE key=?", (k,)).rowcount
                    conv = retry_messages(conv, row[0] or "")
        words = set(e.words)
        forms = quoted_forms(e.texts)
        quoting = [k for k, text in db.execute("SELECT key, text FROM responses")
                   if isinstance(text, str) and (words & words_of(text) or any(x in text for x in forms))]
        for k in quoting:
            n += db.execute("DELETE FROM responses WHERE key=?", (k,)).rowcount
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


def _strings(o):
    """Every string in a decoded JSON value (keys included)."""
    if isinstance(o, str):
        yield o
    elif isinstance(o, dict):
        for k, v in o.items():
            yield k
            yield from _strings(v)
    elif isinstance(o, list):
        for v in o:
            yield from _strings(v)


def scrub_outputs(paths, e: Erasure) -> int:
    """Take out of each ``score`` output (JSONL) the records of the erasure's bank that picked a
    forgotten turn (every record of the bank for a whole bank) or quote a forgotten text."""
    from ..score.writer import ResumableJsonl

    gone, n, forms = set(e.turn_ids), 0, quoted_forms(e.texts)  # a record may keep a raw JSON reply
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        ids = []
        for line in p.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = loads_json(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "id" not in rec:
                continue
            strings = list(_strings(rec))  # the decoded values: a dump escapes quotes and newlines
            mine = rec.get("bank_id") == e.bank_id
            if (mine and (e.whole or gone & set(rec.get("units") or ()))) or \
                    any(x in s for x in forms for s in strings):
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
    """Scrub every cache (the defaults and ``caches``) and the ``outputs`` (with the erasure's own
    ``outputs``); returns the counts
    (nothing to do, nothing touched: a forget of ids the bank did not hold)."""
    if not (e.turn_ids or e.whole):
        return {"cache_rows": 0, "output_records": 0}
    files = list(dict.fromkeys([*default_caches(), *map(Path, caches)]))
    rows = sum(scrub_cache(p, e) for p in files)
    outputs = list(dict.fromkeys([*map(str, outputs), *e.outputs]))  # the journal's too: a rerun may name none
    return {"cache_rows": rows, "output_records": scrub_outputs(outputs, e) if outputs else 0}

