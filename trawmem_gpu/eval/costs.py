"""The cost table of an end-to-end run (``eval.end_to_end``): the shape of the paper's Table 3.

Per conversation and as means: construction time (what the method must build, from the banks'
build stats or measured by rebuilding them with the embedding cache off), retrieval time per
conversation and per query, answer time, total time, answer-context tokens per question and LLM
tokens per stage, with the definitions of the columns written beside the figures
(:data:`COST_DEFINITIONS`).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Optional

from ..errors import loads_json

# What each method must build before it can answer a query (components of the bank build
# stats). Cosine and hybrid need unit vectors; BM25 only its index (built when a bank is
# loaded, timed as ``index_s``); full context needs nothing.
_CONSTRUCTION = {
    "trawmem": ("wall_s",),
    "cosine": ("encode_units_s",),
    "hybrid": ("encode_units_s",),
    "bm25": (),
    "full": (),
    "trimem": ("wall_s",),
}
_NEEDS_INDEX = {"trawmem": True, "cosine": True, "hybrid": True, "bm25": True, "full": False, "trimem": True}


def _r(x: Optional[float], nd: int = 4) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def _mean(xs) -> Optional[float]:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def build_config(res: dict):
    """The ``BuildConfig`` a run's banks were built with (its ``config.build``; the defaults without one)."""
    from ..ingest.config import BuildConfig

    d = (res.get("config") or {}).get("build")
    return BuildConfig.from_dict(d) if d else BuildConfig()


_MEASURED_FILE = "build_times.json"


def _bank_fingerprint(bank, build_cfg) -> str:
    h = hashlib.sha256(json.dumps([bank.encoder_id, build_cfg.to_dict()], sort_keys=True).encode())
    for t in bank.turns:
        h.update(f"\x00{t.turn_id}\x00{t.timestamp}\x00{t.speaker}\x00{t.text}\x00{t.caption}".encode())
    return h.hexdigest()[:32]


def _measured_build_stats(banks: dict, build_cfg, progress: bool) -> dict:
    """Build seconds of ``banks`` (which carry no build stats), measured by rebuilding them with
    the embedding cache off; kept in the cache directory so the next run does not rebuild."""
    from ..ingest import build_banks
    from ..data import Conversation
    from ..encode import get_encoder
    from ..paths import default_cache_dir

    path = default_cache_dir() / _MEASURED_FILE
    try:
        known = loads_json(path.read_text())
    except (OSError, ValueError):
        known = {}
    fp = {bid: _bank_fingerprint(b, build_cfg) for bid, b in banks.items()}
    out = {bid: known[f] for bid, f in fp.items() if isinstance(known.get(f), dict)}
    todo = [bid for bid in banks if bid not in out]
    if todo:
        convs = [Conversation(bid, list(banks[bid].turns)) for bid in todo]
        enc = get_encoder(build_cfg.encoder, cache=False)
        t0 = time.perf_counter()
        _, st = build_banks(convs, build_cfg, enc, progress=progress)
        wall = time.perf_counter() - t0
        n = max(1, sum(len(c.turns) for c in convs))
        for c in convs:
            share = len(c.turns) / n
            d = {k: round(float(v) * share, 4) for k, v in st.items() if k.endswith("_s")}
            d.update({"wall_s": round(wall * share, 4), "share": round(share, 6), "batch_banks": len(convs),
                      "batch_units": n, "embedding_cache_hits": 0, "measured_at": time.time()})
            out[c.bank_id] = d
            known[fp[c.bank_id]] = d
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    return out


def _construction(method: str, banks: dict, bank_ids: list[str], build_cfg, progress: bool) -> tuple[dict, str]:
    """Seconds per bank to construct what ``method`` needs, and where the figure comes from."""
    from ..select.context import BankContext

    parts = _CONSTRUCTION.get(method, ("wall_s",))
    index_s = {}
    for bid in bank_ids:  # the per-bank derived state every query method uses (BM25 index, ...)
        t0 = time.perf_counter()
        BankContext.of(banks[bid])
        index_s[bid] = time.perf_counter() - t0 if _NEEDS_INDEX.get(method, True) else 0.0
    stats = {bid: (banks[bid].stats or {}).get("build") for bid in bank_ids}
    missing = [bid for bid in bank_ids if stats[bid] is None]
    source = "bank build stats (recorded when the banks were built)"
    if not parts:
        source = "nothing to build for this method beyond its per-bank index"
    elif missing:
        if build_cfg.segmentation == "llm" or build_cfg.heads == "llm":
            source = "unavailable: banks carry no build stats and an LLM build is not re-run to time it"
            out = {bid: None for bid in bank_ids}
            return {"per_bank": out, "index_s": index_s, "parts": list(parts)}, source
        stats.update(_measured_build_stats({bid: banks[bid] for bid in missing}, build_cfg, progress))
        source = (f"measured for {len(missing)} bank(s) without build stats: rebuilt with the embedding "
                  f"cache off (measurement kept in {_MEASURED_FILE} under the cache directory)")
    per = {}
    for bid in bank_ids:
        s = stats[bid] or {}
        per[bid] = sum(float(s.get(p, 0.0)) for p in parts) + index_s[bid]
    hits = sum(int((stats[b] or {}).get("embedding_cache_hits", 0)) for b in bank_ids)
    return {"per_bank": per, "index_s": index_s, "parts": list(parts), "embedding_cache_hits_at_build": hits}, source


def _stage_tokens(records: list[dict], stage: str, usage: dict) -> Optional[dict]:
    u = usage.get(stage)
    if u is None:
        return None
    rows = [r["llm_usage"][stage] for r in records if r["llm_usage"].get(stage)]
    return {
        "calls": len(rows),
        "requests_sent": u["requests"],
        "cache_hits": u["cached"],
        "errors": u["errors"],
        "prompt_tokens": sum(int(x["prompt_tokens"] or 0) for x in rows),
        "completion_tokens": sum(int(x["completion_tokens"] or 0) for x in rows),
        "prompt_tokens_sent": u["prompt_tokens"],
        "completion_tokens_sent": u["completion_tokens"],
        "wall_s": u["wall_s"],
    }


COST_DEFINITIONS = {
    "construction_s": "seconds to build what the method needs per conversation: TrawMem the whole bank "
                      "(encode units, segment, heads, encode heads, graph); cosine/hybrid the unit "
                      "vectors; plus the per-bank index (BM25, positions, adjacency) built at load; "
                      "full context nothing. Build seconds are the bank's share (by units) of one batched "
                      "build; an embedding cache warm at build time makes them smaller (see "
                      "construction_detail.embedding_cache_hits_at_build).",
    "retrieval_s": "question encoding (the conversation's share) plus selection, summed over its "
                   "questions; workspace rendering and token counting are excluded; question vectors "
                   "served by the embedding cache (construction_detail.question_embedding_cache_hits) "
                   "make it smaller",
    "answer_s": "wall seconds of the batched answer stage, shared by question count; near 0 when "
                "answers come from the response cache",
    "total_s": "construction_s + retrieval_s + answer_s (judging is evaluation cost, listed apart)",
    "context_tokens_per_question": "tokens of the rendered workspace, counted with the named tokenizer",
    "llm_tokens": "prompt/completion tokens as the server reported them, over all questions (cache hits "
                  "count their original tokens); *_sent counts only requests sent in this run",
}
"""What each column of :func:`cost_table` counts (its ``definitions``)."""


def cost_table(res: dict, banks: dict, usage: dict, progress: bool = True) -> dict:
    """The paper's Table 3 for this run: per conversation and the means over conversations."""
    from ..tokens import TOKENIZER_NAME

    records = res["records"]
    method = res.get("method", "trawmem")
    build_cfg = build_config(res)
    bank_ids = list(dict.fromkeys(r["bank_id"] for r in records))
    n_q = len(records)
    by_bank = {b: [r for r in records if r["bank_id"] == b] for b in bank_ids}
    cons, cons_source = _construction(method, banks, bank_ids, build_cfg, progress)

    timing = res.get("timing") or {}
    enc_q = float(timing.get("encode_questions_s", 0.0))
    per_q_fallback = float(res.get("selection_seconds_per_query", 0.0))
    ans_wall = float((usage.get("answer") or {}).get("wall_s", 0.0))
    jud_wall = float((usage.get("judge") or {}).get("wall_s", 0.0))

    rows = []
    for bid in bank_ids:
        rs = by_bank[bid]
        share = len(rs) / max(1, n_q)
        retr = sum(float(r.get("select_s", per_q_fallback)) for r in rs) + enc_q * share
        c = cons["per_bank"][bid]
        ans = ans_wall * share

        def tok(stage, key):
            return sum(int((r["llm_usage"].get(stage) or {}).get(key) or 0) for r in rs)

        rows.append({
            "bank_id": bid, "n_units": banks[bid].n_units, "n_questions": len(rs),
            "construction_s": _r(c), "retrieval_s": _r(retr), "retrieval_s_per_query": _r(retr / max(1, len(rs)), 6),
            "answer_s": _r(ans), "total_s": _r(None if c is None else c + retr + ans),
            "context_tokens_per_question": _r(_mean(r["context_tokens"] for r in rs), 1),
            "answer_prompt_tokens": tok("answer", "prompt_tokens"),
            "answer_completion_tokens": tok("answer", "completion_tokens"),
            "judge_prompt_tokens": tok("judge", "prompt_tokens"),
            "judge_completion_tokens": tok("judge", "completion_tokens"),
        })
    n_b = max(1, len(rows))
    cons_vals = [r["construction_s"] for r in rows]
    cons_mean = None if any(v is None for v in cons_vals) else sum(cons_vals) / n_b
    retr_total = sum(r["retrieval_s"] for r in rows)
    ans_stage = _stage_tokens(records, "answer", usage)
    llm_build = build_cfg.segmentation == "llm" or build_cfg.heads == "llm"
    return {
        "method": method,
        "tokenizer": res.get("tokenizer", TOKENIZER_NAME),
        "encoder": res.get("encoder"),
        "n_conversations": len(rows),
        "n_questions": n_q,
        "construction_s_per_conversation": _r(cons_mean),
        "construction_source": cons_source,
        "retrieval_s_per_conversation": _r(retr_total / n_b),
        "retrieval_s_per_query": _r(retr_total / max(1, n_q), 6),
        "answer_s_per_conversation": _r(ans_wall / n_b),
        "judge_s_per_conversation": _r(jud_wall / n_b) if "judge" in usage else None,
        "total_s_per_conversation": _r(None if cons_mean is None else cons_mean + (retr_total + ans_wall) / n_b),
        "context_tokens_per_question": _r(_mean(r["context_tokens"] for r in records), 1),
        "answer_prompt_tokens_per_question": _r(ans_stage["prompt_tokens"] / max(1, n_q), 1) if ans_stage else None,
        "llm_tokens": {
            "build": ({"llm_used": True, "note": "build-time LLM tokens are not recorded in bank stats"}
                      if llm_build else {"llm_used": False, "prompt_tokens": 0, "completion_tokens": 0}),
            "answer": ans_stage,
            "judge": _stage_tokens(records, "judge", usage),
        },
        "construction_detail": {"components": cons["parts"], "index_s_per_bank": {k: _r(v) for k, v in
                                                                                  cons["index_s"].items()},
                                "embedding_cache_hits_at_build": cons.get("embedding_cache_hits_at_build"),
                                "question_embedding_cache_hits": timing.get("question_embedding_cache_hits")},
        "per_conversation": rows,
        "definitions": dict(COST_DEFINITIONS),
    }
