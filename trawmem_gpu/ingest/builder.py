"""Stage 1: conversations -> banks (threads, heads, vectors, thread graph), full or incremental.

All conversations of a build are processed together: one batched encoder pass over every
unit of every bank, one batched LLM call per stage when an LLM is configured, then one encoder
pass over every head. Incremental updates re-segment only the session that new turns extend
(and new sessions), keep every other thread and head as it was, encode only new text, and
recompute the thread graph from the stored head vectors (milliseconds), so the result equals a
full build over the same turns.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field, replace

import numpy as np

from .config import BuildConfig
from ..data.bursts import appended_session_gaps, burst_gap, burst_starts, burst_vectors, session_gaps
from ..data.fields import session_field
from ..data.types import Conversation, Turn
from ..encode.base import Encoder
from ..errors import InputError, NoLLMConfigured
from ..store.arrays import extend_rows
from ..store.bank import Bank
from ..store.graph import edges_from_knn, knn_table, update_knn
from ..store.bursts import SESSION_GAPS, held_session_gaps
from ..store.segments import Extension
from ..store.turn_columns import appended, as_stored
from .heads import extractive_head
from .segment import embedding_segments, fixed_segments


@dataclass
class _Work:
    """One bank in flight: its turns, unit vectors and thread starts (global unit offsets)."""

    conv: Conversation
    vecs: np.ndarray
    starts: list[int] | None = None
    heads: list[str] | None = None
    head_kind: list[str] | None = None
    keep_threads: int = 0
    """Threads taken unchanged from an existing bank (incremental update)."""
    seg_fallbacks: int = 0
    """Sessions whose LLM segmentation was malformed and fell back to embedding segmentation."""
    head_fallbacks: int = 0
    """Threads whose LLM head was malformed and fell back to the extractive head."""
    llm_why: dict = field(default_factory=dict)
    """LLM fallbacks by step and reason (``{"segment": {why: n}, "head": {...}}``): the bank's
    ``stats["llm_fallbacks"]``, which ``trawmem info`` shows."""
    gaps: np.ndarray | None = None
    """Every gap inside a session of ``conv.turns`` (``data.bursts.session_gaps``), where the burst
    gap comes from: an update passes the old bank's, extended by the new turns'; else computed on
    first use. Once per bank, never per session or thread: that made a build quadratic."""
    tau: float | None = None
    """The conversation's burst gap (:meth:`burst_gap`), computed once."""

    def burst_gap(self) -> float:
        """``data.bursts.burst_gap`` of :attr:`gaps` (the whole conversation's statistic)."""
        if self.tau is None:
            if self.gaps is None:
                self.gaps = session_gaps(self.conv.turns)
            self.tau = burst_gap(self.gaps)
        return self.tau

    def bursts_from(self, lo: int) -> list[int]:
        """Burst starts of the turns from the session holding unit ``lo`` on (ascending)."""
        turns = self.conv.turns
        while lo > 0 and turns[lo - 1].session == turns[lo].session:
            lo -= 1
        return burst_starts(turns, lo, None, self.burst_gap())


def _session_spans(turns: list[Turn], lo: int = 0) -> list[tuple[int, int]]:
    spans, s = [], lo
    for i in range(lo + 1, len(turns) + 1):
        if i == len(turns) or turns[i].session != turns[s].session:
            spans.append((s, i))
            s = i
    return spans


def _segment_session(vecs: np.ndarray, cfg: BuildConfig, mode: str, bursts: list[int] | None = None) -> list[int]:
    """Thread starts of one session (``vecs``: its unit vectors). With ``bursts`` (the session's
    burst starts, ``data.bursts``), the session is segmented as its bursts (each one vector,
    ``burst_vectors``), so a thread never starts inside a burst."""
    if bursts is not None and len(bursts) < len(vecs):
        return [bursts[s] for s in _segment_session(burst_vectors(vecs, bursts + [len(vecs)]), cfg, mode)]
    if mode == "fixed":
        return fixed_segments(len(vecs), cfg.fixed_size)
    return embedding_segments(vecs, window=cfg.window, depth_std=cfg.depth_std, min_depth=cfg.min_depth,
                              min_len=cfg.min_thread_len, max_len=cfg.max_thread_len)


def _segment(works: list[_Work], cfg: BuildConfig, llm, stats: dict, from_unit: list[int]) -> None:
    """Fill ``w.starts`` for units at or after ``from_unit[i]`` (a session start)."""
    jobs = []  # (work index, lo, hi)
    for wi, w in enumerate(works):
        for lo, hi in _session_spans(w.conv.turns, from_unit[wi]):
            jobs.append((wi, lo, hi))
    llm_bounds: list = [None] * len(jobs)
    if cfg.segmentation == "llm":
        if llm is None:
            raise NoLLMConfigured("segmentation='llm' needs an LLM backend (none configured); "
                                  "set `segmentation` to 'embedding' or give an `llm`")
        from .llm_threads import llm_segment

        sessions = [[t.embed_text() for t in works[wi].conv.turns[lo:hi]] for wi, lo, hi in jobs]
        llm_bounds, whys = llm_segment(sessions, llm)
        stats["llm_segment_fallbacks"] = stats.get("llm_segment_fallbacks", 0) + sum(w is not None for w in whys)
        for (wi, _, _), why in zip(jobs, whys):
            _add_why(stats.setdefault("llm_fallbacks", {}), "segment", {why: 1} if why else {})
            _add_why(works[wi].llm_why, "segment", {why: 1} if why else {})
    for (wi, lo, hi), lb in zip(jobs, llm_bounds):
        w = works[wi]
        if cfg.segmentation == "llm" and lb is None:
            w.seg_fallbacks += 1
        if lb is not None:
            local = sorted({0, *[int(b) for b in lb if 0 < int(b) < hi - lo]})
        else:
            mode = "embedding" if cfg.segmentation == "llm" else cfg.segmentation
            local = _segment_session(w.vecs[lo:hi], cfg, mode, [b - lo for b in burst_starts(w.conv.turns, lo, hi, w.burst_gap())])
        w.starts.extend(lo + s for s in local)


def _add_why(into: dict, step: str, whys: dict) -> None:
    """Add the fallback counts ``whys`` (reason -> n) of ``step`` to ``into`` (step -> reason -> n)."""
    if not whys:
        return
    d = into.setdefault(step, {})
    for why, n in whys.items():
        d[why] = d.get(why, 0) + int(n)


def _heads(works: list[_Work], cfg: BuildConfig, llm, stats: dict, encoder: Encoder | None = None) -> None:
    todo = []  # (work index, thread index)
    for wi, w in enumerate(works):
        ends = w.starts[1:] + [len(w.conv.turns)]
        for j in range(w.keep_threads, len(w.starts)):
            todo.append((wi, j, w.starts[j], ends[j]))
    texts: list = [None] * len(todo)
    if cfg.heads == "llm":
        if llm is None:
            raise NoLLMConfigured("heads='llm' needs an LLM backend (none configured); set `heads` to 'extractive' "
                                  "or give an `llm`")
        from .llm_threads import llm_heads, thread_text

        rendered = [thread_text(works[wi].conv.turns[s:e]) for wi, j, s, e in todo]
        texts, whys = llm_heads(rendered, llm, sources=[[t.embed_text() for t in works[wi].conv.turns[s:e]]
                                                       for wi, j, s, e in todo],
                                embed=None if encoder is None else
                                (lambda xs: encoder.encode(xs, batch_size=cfg.encode_batch_size)),
                                source_vecs=[works[wi].vecs[s:e] for wi, j, s, e in todo])
        stats["llm_head_fallbacks"] = stats.get("llm_head_fallbacks", 0) + sum(w is not None for w in whys)
        for (wi, _, _, _), why in zip(todo, whys):
            _add_why(stats.setdefault("llm_fallbacks", {}), "head", {why: 1} if why else {})
            _add_why(works[wi].llm_why, "head", {why: 1} if why else {})
    bursts: dict[int, list[int]] = {}  # work index -> its burst starts from its first new thread on
    for (wi, j, s, e), txt in zip(todo, texts):
        w = works[wi]
        if not txt and wi not in bursts:
            bursts[wi] = w.bursts_from(s)  # a work's threads come in order: s is its first new one
        if txt:
            w.heads.append(txt)
            w.head_kind.append("llm")
        else:
            if cfg.heads == "llm":
                w.head_fallbacks += 1
            w.heads.append(extractive_head(w.conv.turns[s:e], w.vecs[s:e], sentences=cfg.head_sentences,
                                           words=cfg.head_words, bursts=_within(bursts[wi], s, e)))
            w.head_kind.append("extractive")


def _within(starts: list[int], s: int, e: int) -> list[int]:
    """The burst starts of ``starts`` (ascending) in ``[s, e)``, as offsets from ``s``."""
    return [b - s for b in starts[bisect_left(starts, s):bisect_left(starts, e)]]


def _encode_units(convs: list[Conversation], encoder: Encoder, cfg: BuildConfig, progress: bool,
                  skip: list[int] | None = None, old: list[np.ndarray] | None = None,
                  on_units=None) -> list[np.ndarray]:
    skip = skip or [0] * len(convs)
    texts = [t.embed_text() for c, k in zip(convs, skip) for t in c.turns[k:]]
    v = encoder.encode(texts, batch_size=cfg.encode_batch_size, progress=progress, desc="encode units",
                       on_batch=on_units)
    out, p = [], 0
    for i, (c, k) in enumerate(zip(convs, skip)):
        n = len(c.turns) - k
        new = v[p:p + n]
        out.append(extend_rows(old[i][:k], new) if k else new)
        p += n
    return out


def _graph(head_vecs: np.ndarray, cfg: BuildConfig, old: tuple | None = None):
    """``(knn sims, knn ids, rows that changed, edges)`` of ``head_vecs``: the nearest-head table in
    full, or with ``old`` = ``(old bank, keep, fresh)`` updated from the old bank's table
    (``store.graph.update_knn``; its table is computed first when it has none or another ``k``)."""
    if old is not None:
        bank, keep, fresh = old
        sims, ids = bank.knn_sims, bank.knn_ids
        if ids is None or ids.shape[1] != cfg.knn:
            sims, ids = knn_table(bank.head_vecs, cfg.knn)
        sims, ids, changed = update_knn(sims, ids, keep, head_vecs, fresh)
    else:
        sims, ids = knn_table(head_vecs, cfg.knn)
        changed = np.arange(len(head_vecs))
    return sims, ids, changed, edges_from_knn(sims, ids, cfg.knn_threshold)


def _finish(works: list[_Work], encoder: Encoder, cfg: BuildConfig, progress: bool, stats: dict,
            old_head_vecs: list[np.ndarray | None], graphs: list | None = None,
            reuse: list[dict] | None = None) -> tuple[list[Bank], list[np.ndarray]]:
    """The banks of ``works`` and, per bank, the nearest-head rows that changed: new heads encoded
    (``old_head_vecs[i][:keep_threads]`` kept; a head whose text is a key of ``reuse[i]`` takes that
    vector), the graph computed (``graphs[i]``: ``_graph``'s ``old``, or None for the full table)."""
    t0 = time.perf_counter()
    reuse = reuse or [{}] * len(works)
    todo = [w.heads[j] for w, r in zip(works, reuse) for j in range(w.keep_threads, len(w.heads)) if w.heads[j] not in r]
    hv = encoder.encode(todo, batch_size=cfg.encode_batch_size, progress=progress, desc="encode heads") \
        if todo else np.zeros((0, encoder.dim), dtype=np.float32)
    stats["encode_heads_s"] = stats.get("encode_heads_s", 0.0) + time.perf_counter() - t0
    stats["encoded_heads"] = stats.get("encoded_heads", 0) + len(todo)
    banks, changes, p = [], [], 0
    for i, (w, ohv, r) in enumerate(zip(works, old_head_vecs, reuse)):
        new = []
        for j in range(w.keep_threads, len(w.heads)):
            if w.heads[j] in r:
                new.append(r[w.heads[j]])
            else:
                new.append(hv[p])
                p += 1
        head_vecs = np.stack(new).astype(np.float32) if new else np.zeros((0, encoder.dim), dtype=np.float32)
        if w.keep_threads:
            head_vecs = np.concatenate([ohv[:w.keep_threads], head_vecs])
        t1 = time.perf_counter()
        sims, ids, changed, (src, dst, ew, kind) = _graph(head_vecs, cfg, graphs[i] if graphs else None)
        stats["graph_s"] = stats.get("graph_s", 0.0) + time.perf_counter() - t1
        stats["knn_rows"] = stats.get("knn_rows", 0) + len(changed)
        banks.append(Bank(bank_id=w.conv.bank_id, turns=as_stored(w.conv.turns),
                          thread_offsets=np.array(w.starts + [len(w.conv.turns)], dtype=np.int64),
                          heads=w.heads, head_kind=w.head_kind, unit_vecs=w.vecs, head_vecs=head_vecs,
                          edge_src=src, edge_dst=dst, edge_w=ew, edge_kind=kind, encoder_id=encoder.id,
                          build_config=cfg.to_dict(),
                          stats={"segmentation": cfg.segmentation, "heads": cfg.heads,
                                 "llm_segment_fallbacks": w.seg_fallbacks, "llm_head_fallbacks": w.head_fallbacks,
                                 **({"llm_fallbacks": w.llm_why} if w.llm_why else {})},
                          knn_sims=sims, knn_ids=ids))
        changes.append(changed)
    return banks, changes


def build_banks(convs: list[Conversation], cfg: BuildConfig | None = None, encoder: Encoder | None = None,
                llm=None, progress: bool = True, on_units=None) -> tuple[list[Bank], dict]:
    """Build one bank per conversation. Returns (banks, stats with per-stage seconds).

    :param on_units: called with a number of units after each encoder batch of unit texts
        (a progress bar that moves while a large build encodes)
    """
    cfg = cfg or BuildConfig()
    if encoder is None:
        from ..encode import get_encoder

        encoder = get_encoder(cfg.encoder)
    for c in convs:
        if not c.turns:
            raise InputError(f"conversation {c.bank_id!r} is empty")
    stats: dict = {"n_banks": len(convs), "n_units": sum(len(c.turns) for c in convs)}
    t0 = time.perf_counter()
    vecs = _encode_units(convs, encoder, cfg, progress, on_units=on_units)
    stats["encode_units_s"] = time.perf_counter() - t0
    works = [_Work(c, v, [], [], []) for c, v in zip(convs, vecs)]
    t0 = time.perf_counter()
    _segment(works, cfg, llm, stats, [0] * len(works))
    stats["segment_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _heads(works, cfg, llm, stats, encoder)
    stats["heads_s"] = time.perf_counter() - t0
    banks, _ = _finish(works, encoder, cfg, progress, stats, [None] * len(works))
    for b, w in zip(banks, works):
        b.validate()
        if w.gaps is not None:
            b.__dict__[SESSION_GAPS] = w.gaps
    return banks, stats


def update_bank(bank: Bank, new_turns: list[Turn], cfg: BuildConfig | None = None,
                encoder: Encoder | None = None, llm=None, progress: bool = False) -> tuple[Bank, dict]:
    """Append ``new_turns`` (in source order, after the bank's last turn) to ``bank``.

    Threads of sessions before the first session the new turns touch are kept with their
    heads and vectors; that session is re-segmented whole (segmentation is a function of the
    session alone) and new sessions are segmented fresh. Raises ``InputError`` on a duplicate
    turn id or on turns that go back to an earlier session.

    The result's ``extends`` says what it adds to ``bank`` (``store.segments.Extension``): the
    store writes that as a segment. It is None when the append changes more than a tail (another
    build config than the bank's, or a bank whose nearest-head table had to be computed).
    """
    cfg = cfg or BuildConfig.from_dict(bank.build_config) if bank.build_config else (cfg or BuildConfig())
    if encoder is None:
        from ..encode import get_encoder

        encoder = get_encoder(cfg.encoder)
    if encoder.id != bank.encoder_id:
        raise InputError(f"bank {bank.bank_id!r} was built with encoder {bank.encoder_id!r}, not {encoder.id!r}")
    if not new_turns:
        return bank, {"n_new_units": 0}
    _check_new(bank, new_turns)
    turns = appended(bank.turns, new_turns)  # a loaded bank's columns stay shared: the new turns are a tail
    conv = Conversation(bank.bank_id, turns)
    # First unit of the session the new turns open or extend.
    n_old, last_session = bank.n_units, bank.turns[-1].session
    first = n_old
    if new_turns[0].session == last_session:
        while first > 0 and turns[first - 1].session == last_session:
            first -= 1
    keep_threads = int(np.searchsorted(bank.thread_offsets, first, side="right")) - 1 if first < n_old \
        else bank.n_threads
    stats: dict = {"n_new_units": len(new_turns), "resegmented_units": len(turns) - first,
                   "kept_threads": keep_threads}
    t0 = time.perf_counter()
    vecs = _encode_units([conv], encoder, cfg, progress, skip=[n_old], old=[bank.unit_vecs])[0]
    stats["encode_units_s"] = time.perf_counter() - t0
    w = _Work(conv, vecs, [int(s) for s in bank.thread_offsets[:keep_threads]], list(bank.heads[:keep_threads]),
              list(bank.head_kind[:keep_threads]), keep_threads, gaps=_appended_gaps(bank, turns))
    t0 = time.perf_counter()
    _segment([w], cfg, llm, stats, [first])
    stats["segment_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _heads([w], cfg, llm, stats, encoder)
    stats["heads_s"] = time.perf_counter() - t0
    same_graph = bank.knn_ids is not None and bank.knn_ids.shape[1] == cfg.knn
    keep = np.where(np.arange(bank.n_threads) < keep_threads, np.arange(bank.n_threads), -1)
    fresh = np.arange(keep_threads, len(w.heads), dtype=np.int64)
    replaced = {bank.heads[j]: bank.head_vecs[j] for j in range(keep_threads, bank.n_threads)}
    (new_bank,), (changed,) = _finish([w], encoder, cfg, progress, stats, [bank.head_vecs], [(bank, keep, fresh)],
                                      [replaced])
    for step, whys in (bank.stats or {}).get("llm_fallbacks", {}).items():  # counted over the build and its updates
        _add_why(new_bank.stats.setdefault("llm_fallbacks", {}), step, whys)
    # the layers cite turn ids, which an append keeps: they carry over (``ingest.layers.facts`` adds new facts)
    new_bank = replace(new_bank, facts=bank.facts, fact_vecs=bank.fact_vecs, profiles=bank.profiles,
                       profile_vecs=bank.profile_vecs, layer_sources=dict(bank.layer_sources))
    held = bank.__dict__.get("_turn_map")
    if isinstance(held, dict):  # the ids map of the bank appended to, with the new turns (``Bank.turn_map``;
        # a map over columns, ``TurnIds``, is made anew from the shared columns' id index)
        new_bank.__dict__["_turn_map"] = {**held, **{t.turn_id: t for t in new_bank.turns[n_old:]}}
    new_bank.validate(since=(n_old, keep_threads))
    if w.gaps is not None:
        new_bank.__dict__[SESSION_GAPS] = w.gaps  # the next append extends them (a bank's turns never change)
    if same_graph and new_bank.build_config == bank.build_config:
        new_bank.extends = Extension.of(bank, keep_threads, changed[changed < keep_threads])
    return new_bank, stats


def _appended_gaps(bank: Bank, turns: list[Turn]) -> np.ndarray | None:
    """The session gaps of ``turns`` (``bank``'s turns, then new ones) from those ``bank`` keeps
    (``store.bursts.held_session_gaps``), or None (computed whole when needed)."""
    got = held_session_gaps(bank)
    return None if got is None else appended_session_gaps(got, bank.n_units, turns)


def _check_new(bank: Bank, new_turns: list[Turn]) -> None:
    """``InputError`` for a new turn whose id the bank holds, or one that goes back a session."""
    known, seen = bank.turn_map(), set()  # the bank's map is shared: never written here
    prev = bank.turns[-1].session
    for t in new_turns:
        if t.turn_id in known or t.turn_id in seen:
            raise InputError(f"bank {bank.bank_id!r}: duplicate turn id {t.turn_id!r}")
        session_field(t.session, "session", f"bank {bank.bank_id!r}: turn {t.turn_id!r}")
        if t.session < prev:
            raise InputError(f"bank {bank.bank_id!r}: turn {t.turn_id!r} goes back to session {t.session} "
                             f"after session {prev}")
        seen.add(t.turn_id)
        prev = t.session
