"""Banks that fail alone: what a forget of a bank reaches when the bank's files do not load.

A collection opens even when one of its banks cannot be loaded (a corrupt or truncated file, a
value the engine cannot hold: a session beyond 64 bits, a timezone-aware time) or prepared for
the engine: that bank is *quarantined* (``BankRegistry.quarantined``: bank id -> cause) and
every other bank is served. Selecting from a quarantined bank, adding to it or forgetting some
of its turns raises :class:`~trawmem_gpu.errors.QuarantinedBank`; forgetting the whole bank
removes it, erasing from the caches whatever of it can still be read (:func:`stored_erasure`).
"""
from __future__ import annotations

from pathlib import Path

from ..encode.cache import EmbeddingCache
from ..errors import BankError, loads_json
from ..store.files import META, load_bank, turn_from, turn_record
from ..store.layers import LAYERS
from .erase import Erasure, vector_digest, words_of


def cause_of(e: BaseException, root: Path) -> str:
    """A load failure as one line, with paths relative to the collection ``root`` (a server's
    clients read it; the host's directories are not theirs)."""
    msg = str(e) if isinstance(e, BankError) else f"{type(e).__name__}: {e}"
    for r in dict.fromkeys((str(root.resolve()), str(root))):
        msg = msg.replace(r.rstrip("/") + "/", "")
    return msg


def stored_erasure(bank_dir: Path, bank_id: str, dirname: str | None, encoder_id: str | None = None) -> Erasure:
    """The erasure of the whole stored bank at ``bank_dir``: from the bank when it loads, else
    from whatever of its files still reads (texts and turns of the units and segment files, vectors
    of the tensor files, heads of the threads and segment files), so a quarantined bank's forget
    erases all it can.
    ``encoder_id``: the collection's, for the cache keys when ``meta.json`` does not read."""
    try:
        return Erasure.of(load_bank(bank_dir, bank_id=bank_id), None, (), dirname)
    except BankError:
        pass
    meta = _read_json(bank_dir / META)
    meta = meta if isinstance(meta, dict) else {}
    records, heads = _records(bank_dir, meta)
    turns, texts, ids = [], [], []
    for r in records:
        if not isinstance(r, dict):
            continue
        ids += [r["id"]] if isinstance(r.get("id"), str) else []
        texts += [x for x in (r.get("text"), r.get("caption")) if isinstance(x, str)]
        try:
            t = turn_from(r)
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        turns.append(t)
        texts += [t.embed_text(), t.lexical_text()]
    texts = [x for x in dict.fromkeys(texts + heads) if x]
    enc = meta.get("encoder_id") if isinstance(meta.get("encoder_id"), str) else encoder_id
    keys = [EmbeddingCache.key(enc, q, x) for x in texts for q in (False, True)] if enc else []
    sessions: dict = {}
    for t in turns:
        sessions.setdefault(t.session, []).append(turn_record(t))
    words = sorted({w for x in texts for w in words_of(x)})
    return Erasure(bank_id, list(dict.fromkeys(ids)), True, texts, keys, _vectors(bank_dir), dirname, words,
                   list(sessions.values()))


def _records(bank_dir: Path, meta: dict) -> tuple[list, list[str]]:
    """The turn records and heads every JSON file of the bank directory still holds (the base's
    units and threads of any generation, every segment's, a format-2 bank's heads in ``meta.json``),
    listed or not: whatever a write left there is erased too."""
    records, heads = [], list(meta.get("heads") or ())
    for p in sorted(bank_dir.glob("*.json")) if bank_dir.is_dir() else ():
        rec = _read_json(p)
        if p.name.startswith("units") and isinstance(rec, list):
            records += rec
        elif isinstance(rec, dict) and p.name != META:
            records += rec.get("turns") if isinstance(rec.get("turns"), list) else []
            heads += rec.get("heads") if isinstance(rec.get("heads"), list) else []
    return [r for r in records if isinstance(r, dict)], [h for h in heads if isinstance(h, str)]


def _read_json(p: Path):
    try:
        return loads_json(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _vectors(bank_dir: Path) -> list[str]:
    """Digests of the unit and head vectors in the bank's tensor files (the base's and every
    segment's; none from a file that does not read)."""
    from safetensors.numpy import load_file

    rows = []
    for p in sorted(bank_dir.glob("*.safetensors")) if bank_dir.is_dir() else ():
        try:
            t = load_file(str(p))
        except Exception:  # noqa: BLE001 - a truncated or corrupt file: nothing to read from it
            continue
        for name in ("unit_vecs", "head_vecs", *(x.tensor for x in LAYERS)):
            a = t.get(name)
            if a is not None and a.ndim == 2:
                rows += [vector_digest(v) for v in a]
    return rows
