"""The bank cache: banks for a data file, built once, in chunks, locally or by a given builder
(``trawmem score --ray`` passes Ray tasks).

A data file becomes one collection (by default under the cache directory, keyed by its
identity: the file's hash, the build config, the units and the formats; ``trawmem eval``,
``score``, ``train-head`` and ``train-affinity`` share this one cache). Banks are built in chunks of conversations and
written as each chunk finishes, so a killed build keeps what it finished and a rerun builds
only the rest. A sidecar ``score-build.json`` in the collection records what it was built from;
pointing a job at a collection built from other data or another config is an error.

Encoding dominates the build on a CPU. Each chunk's units go through the encoder in one call
(sorted by length inside it, so batches pad little) and through the on-disk embedding cache, so
a text seen before, in this job or any earlier one, is not encoded again. The cache commits
every encoder batch, so a build killed inside a chunk loses at most one batch of encoding, and
the progress bar moves per batch.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from .config import BuildConfig
from ..data.types import UNIT_TEXT_VERSION, Conversation
from ..errors import BankError, loads_json, plural, read_json_object
from ..notes import note
from ..paths import default_cache_dir, file_sha256  # noqa: F401 (file_sha256 names the data file)

log = logging.getLogger(__name__)

SIDECAR = "score-build.json"
BUILD_LOG = "score-build-log.json"
"""Sidecars are ``.json`` files (temporaries too): a collection directory accepts those beside its index."""


def build_identity(data_sha: str, cfg: BuildConfig, units: str, *, dayfirst: bool = False) -> dict:
    """What the banks of a data file depend on (the bank cache's key and sidecar): the file's
    sha256, the build config, the units (LongMemEval's ``user`` / ``all``), the unit-text, head-text
    and bank format versions, and ``dayfirst`` (it changes the turns' dates, hence the banks)."""
    from ..store import FORMAT_VERSION
    from .heads import HEAD_TEXT_VERSION

    return {"data_sha256": data_sha, "build": cfg.to_dict(), "units": units, "unit_text_version": UNIT_TEXT_VERSION,
            "head_text_version": HEAD_TEXT_VERSION, "format_version": FORMAT_VERSION, "dayfirst": bool(dayfirst)}


def default_bank_dir(identity: dict) -> Path:
    """Where the bank cache keeps the collection of ``identity`` (``TRAWMEM_CACHE`` honoured)."""
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return default_cache_dir() / "banks" / key


def _chunks(convs: list[Conversation], max_units: int) -> list[list[Conversation]]:
    out, cur, n = [], [], 0
    for c in convs:
        if cur and n + len(c.turns) > max_units:
            out.append(cur)
            cur, n = [], 0
        cur.append(c)
        n += len(c.turns)
    if cur:
        out.append(cur)
    return out


def ensure_collection(convs: list[Conversation], path: str | Path, identity: dict, cfg: BuildConfig, *,
                      encoder=None, progress: bool = True, chunk_units: int = 4096, build_chunks=None,
                      data_path: str | Path | None = None) -> dict:
    """Build into the collection at ``path`` every bank of ``convs`` it does not hold yet.

    Banks it already holds are reused only after the shared check against the data
    (:func:`trawmem_gpu.store.verify.verify_banks`: built from exactly the conversation's turns,
    with ``cfg``), so a ``--banks`` directory from ``trawmem build`` of other (or edited) data is
    refused, naming the bank, even without the sidecar.

    :param build_chunks: ``(chunks of conversations, cfg) -> iterator of (banks, stats)`` to build
        elsewhere (Ray tasks: :func:`trawmem_gpu.score.ray_runner.build_banks_ray`), or None to
        build here with ``encoder``
    :returns: build stats: banks built / reused, units, seconds per stage, units/s, cache hits
    """
    from ..store import Collection
    from ..store.verify import verify_banks

    path = Path(path)
    sc = path / SIDECAR
    repaired = _check_sidecar(path, sc, identity)
    coll = Collection(path, create=True)
    try:
        lacking = set(verify_banks(coll, convs, data_path or "the data", cfg.to_dict(), exact=False))
    except BankError as e:
        raise BankError(f"{e}; remove {path} or use another `banks` directory to build the banks afresh") from None
    if not sc.exists():
        _write_sidecar(path, sc, identity)
    missing = [c for c in convs if c.bank_id in lacking]
    stats: dict = {"banks_total": len(convs), "banks_reused": len(convs) - len(missing), "banks_built": 0,
                   "units_built": 0, "wall_s": 0.0}
    if repaired:
        stats["sidecars_repaired"] = repaired
    if progress:
        units = f" ({plural(sum(len(c.turns) for c in missing), 'unit')})" if missing else ""
        note(log, f"banks in {path}: {reuse_message(len(convs) - len(missing), len(missing))}{units}")
    if not missing:
        return stats
    if encoder is None and build_chunks is None:
        from ..encode import get_encoder

        encoder = get_encoder(cfg.encoder)
    _build_missing(coll, missing, cfg, stats, encoder, progress, chunk_units, build_chunks)
    # keep every build session's figures with the collection (a reused collection still knows its cost)
    tmp = path / "score-build-log.tmp.json"
    tmp.write_text(json.dumps(build_log(path) + [stats], indent=1), encoding="utf-8")
    os.replace(tmp, path / BUILD_LOG)
    return stats


def _check_sidecar(path: Path, sc: Path, identity: dict) -> int:
    """Refuse the collection at ``path`` when its sidecar ``sc`` records other data or another
    config; returns 1 when a damaged sidecar of the automatic directory was removed (it is written
    again from ``identity``), else 0."""
    if not sc.exists():
        return 0
    repaired = 0
    try:
        old = read_json_object(sc, str(sc), "damaged sidecar", BankError)
    except BankError as e:
        if path.resolve() != default_bank_dir(identity).resolve():
            raise BankError(f"{e}; it records what the banks in {path} were built from, so they cannot be "
                            "reused: remove the directory, or use another `banks`") from None
        # the automatic directory is named by its identity's hash: the sidecar can only say that
        note(log, f"trawmem: note: {e}; rewritten from the directory's name (the automatic bank directory)")
        sc.unlink()
        old, repaired = json.loads(json.dumps(identity)), 1
    if old != json.loads(json.dumps(identity)):
        diff = sorted(k for k in identity if old.get(k) != identity[k])
        raise BankError(f"{path} holds banks built from other data or another config (differs in "
                        f"{', '.join(diff)}); use another `banks` directory")
    return repaired


def _write_sidecar(path: Path, sc: Path, identity: dict) -> None:
    """The sidecar ``sc`` of ``path``: what its banks are built from (written atomically)."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = sc.with_name("score-build.tmp.json")
    tmp.write_text(json.dumps(identity, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, sc)


def _build_missing(coll, missing: list[Conversation], cfg: BuildConfig, stats: dict, encoder, progress: bool,
                   chunk_units: int, build_chunks) -> None:
    """Build the banks of ``missing`` into ``coll``, a chunk at a time, adding their figures to ``stats``."""
    from tqdm.auto import tqdm

    from .builder import build_banks

    hits0, miss0 = getattr(encoder, "hits", 0), getattr(encoder, "misses", 0)
    t_start = time.perf_counter()
    # the bar moves per encoder batch (a chunk takes minutes on a CPU), with tqdm's rate and ETA
    bar = tqdm(total=sum(len(c.turns) for c in missing), desc="build banks", unit="unit", disable=not progress,
               smoothing=0.1)
    if build_chunks is not None:
        stream = build_chunks(_chunks(missing, chunk_units), cfg)
    else:
        stream = (build_banks(ch, cfg, encoder, progress=False, on_units=bar.update)
                  for ch in _chunks(missing, chunk_units))
    for banks, st in stream:
        t0 = time.perf_counter()
        coll.put_many(banks)
        stats["write_s"] = stats.get("write_s", 0.0) + time.perf_counter() - t0
        for k, v in st.items():
            if k.endswith("_s") or k in ("embedding_cache_hits", "embedding_cache_misses"):
                stats[k] = stats.get(k, 0.0) + v
        stats["banks_built"] += len(banks)
        n = sum(b.n_units for b in banks)
        stats["units_built"] += n
        if build_chunks is not None:  # the local build moved the bar per encoder batch already
            bar.update(n)
    bar.close()
    stats["wall_s"] = time.perf_counter() - t_start
    stats["units_per_s"] = stats["units_built"] / stats["wall_s"] if stats["wall_s"] > 0 else None
    if build_chunks is None:
        stats["embedding_cache_hits"] = getattr(encoder, "hits", 0) - hits0
        stats["embedding_cache_misses"] = getattr(encoder, "misses", 0) - miss0
    stats["runner"] = getattr(build_chunks, "runner", "other") if build_chunks is not None else "local"


def reuse_message(reused: int, to_build: int) -> str:
    """What a (re)started build reuses: ``17 banks reused, 12 to build``."""
    return f"{plural(reused, 'bank')} reused, {to_build or 'none'} to build"


def build_log(path: str | Path) -> list[dict]:
    """The build sessions recorded for the collection at ``path`` (oldest first)."""
    p = Path(path) / BUILD_LOG
    if not p.exists():
        return []
    try:
        log = loads_json(p.read_text(encoding="utf-8"))
    except ValueError:  # malformed, not UTF-8, or nested too deeply
        return []  # bookkeeping only: a damaged log never blocks a job
    return log if isinstance(log, list) else []
