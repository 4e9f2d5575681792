"""A bank without some of its turns, rebuilt as an append rebuilds it.

Segmentation is a function of a session alone and a head of its thread alone, so only the
sessions that lose turns are re-segmented (whole) and get new heads; every other session keeps
its threads, heads and head vectors; the nearest-head table is updated where the removed and
new heads change it (``store.graph.update_knn``). The result equals a full build over the
remaining turns (``build_banks``), as ``update_bank``'s does over the extended ones. It is a bank
of its own (no ``extends``): the store rewrites it whole, so no file keeps a forgotten turn.

A bank built with LLM segmentation or heads is rebuilt with the LLM when one is given; without
one the touched sessions fall back to embedding segmentation and extractive heads (counted in
the stats): forgetting never waits on, nor fails for, a missing LLM.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .config import BuildConfig
from ..data.types import Conversation
from ..encode.base import Encoder
from ..errors import InputError
from ..store.bank import Bank
from ..store.layers import without_units
from ..store.turn_columns import taken
from .builder import _Work, _finish, _heads, _segment, _session_spans


def without_turns(bank: Bank, turn_ids, encoder: Encoder, llm=None,
                  cfg: BuildConfig | None = None) -> tuple[Bank | None, dict]:
    """``bank`` less the turns ``turn_ids`` (None when no turn is left) and the stats
    (``forgotten``, ``resegmented_units``, ``kept_threads``, LLM fallbacks).

    Ids the bank does not hold are ignored (``stats["missing"]`` lists them): forgetting twice
    forgets once.
    """
    cfg = cfg or (BuildConfig.from_dict(bank.build_config) if bank.build_config else BuildConfig())
    if encoder.id != bank.encoder_id:
        raise InputError(f"bank {bank.bank_id!r} was built with encoder {bank.encoder_id!r}, not {encoder.id!r}")
    drop = set(turn_ids)
    held = {t.turn_id for t in bank.turns}
    stats: dict = {"missing": sorted(drop - held), "forgotten": len(drop & held)}
    if not drop & held:
        return bank, {**stats, "resegmented_units": 0, "kept_threads": bank.n_threads}
    keep = np.array([i for i, t in enumerate(bank.turns) if t.turn_id not in drop], dtype=np.int64)
    if not len(keep):
        return None, {**stats, "resegmented_units": 0, "kept_threads": 0}
    stored = cfg.to_dict()  # what the bank keeps, whatever the touched sessions fall back to
    if llm is None:  # never refuse an erasure for want of an LLM: the touched sessions fall back
        fb = {k: v for k, v in (("segmentation", "embedding"), ("heads", "extractive"))
              if getattr(cfg, k) == "llm"}
        if fb:
            stats["llm_fallback"] = sorted(fb)
            cfg = replace(cfg, **fb)
    touched = {t.session for t in bank.turns if t.turn_id in drop}
    turns = taken(bank.turns, keep)  # columns: new ones without the dropped rows' bytes
    vecs = np.ascontiguousarray(bank.unit_vecs[keep])
    new_index = np.full(bank.n_units, -1, dtype=np.int64)
    new_index[keep] = np.arange(len(keep))
    ut = bank.unit_thread
    # threads kept: those of untouched sessions, with their (renumbered) starts, heads and vectors
    starts, heads, kinds, hvecs, redo = [], [], [], [], []
    for lo, hi in _session_spans(turns):
        if turns[lo].session in touched:
            redo.append((lo, hi))
            continue
        old_first = int(keep[lo])
        for j in range(int(ut[old_first]), int(ut[int(keep[hi - 1])]) + 1):
            starts.append(int(new_index[int(bank.thread_offsets[j])]))
            heads.append(bank.heads[j])
            kinds.append(bank.head_kind[j])
            hvecs.append(j)
    stats["kept_threads"] = len(starts)
    stats["resegmented_units"] = sum(hi - lo for lo, hi in redo)
    t0 = time.perf_counter()
    fresh = []  # per touched session: its sub-bank's starts, heads and kinds (session-local units)
    for lo, hi in redo:
        w = _Work(Conversation(bank.bank_id, turns[lo:hi]), vecs[lo:hi], [], [], [])
        _segment([w], cfg, llm, stats, [0])
        _heads([w], cfg, llm, stats, encoder)
        fresh.append((lo, w))
    stats["segment_heads_s"] = time.perf_counter() - t0
    # merge kept and fresh threads in source order
    rows = [(s, h, k, bank.head_vecs[j], False, j) for s, h, k, j in zip(starts, heads, kinds, hvecs)]
    for lo, w in fresh:
        rows += [(lo + s, h, k, None, True, -1) for s, h, k in zip(w.starts, w.heads, w.head_kind)]
    rows.sort(key=lambda r: r[0])
    new_heads = [r[1] for r in rows if r[4]]
    hv_new = encoder.encode(new_heads, batch_size=cfg.encode_batch_size) if new_heads else None
    it = iter(range(len(new_heads)))
    head_vecs = np.stack([r[3] if not r[4] else hv_new[next(it)] for r in rows]).astype(np.float32)
    # the graph and the bank as _finish writes them, over all threads as "kept" (vectors given);
    # the old table's rows follow their threads (``keep``), the fresh threads' rows are new
    keep = np.full(bank.n_threads, -1, dtype=np.int64)
    keep[[r[5] for r in rows if not r[4]]] = [n for n, r in enumerate(rows) if not r[4]]
    fresh = np.array([n for n, r in enumerate(rows) if r[4]], dtype=np.int64)
    w = _Work(Conversation(bank.bank_id, turns), vecs, [r[0] for r in rows], [r[1] for r in rows],
              [r[2] for r in rows], keep_threads=len(rows))
    (out,), _ = _finish([w], encoder, cfg, False, stats, [head_vecs], [(bank, keep, fresh)])
    out.validate()
    out.build_config = stored
    out = layers_without(bank, out, drop)
    out.stats.update({"llm_segment_fallbacks": int(stats.get("llm_segment_fallbacks", 0)),
                      "llm_head_fallbacks": int(stats.get("llm_head_fallbacks", 0))})
    return out, stats


def layers_without(old: Bank, new: Bank, drop: set) -> Bank:
    """``new`` with ``old``'s other layers less what cites a forgotten turn (``store.layers``: each
    layer's ``forget``, in their order: facts citing one of ``drop`` go, and so do profile sections
    citing a fact that went, re-derived by the next profile build); everything kept keeps its vector."""
    return without_units(old, new, set(drop))
