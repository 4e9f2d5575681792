"""LongMemEval's official retrieval metrics, next to this project's evidence metrics.

The definitions follow ``src/retrieval/eval_utils.py`` of the LongMemEval repository
(reimplemented, not copied), for a ranked list of unit ids against a bank's corpus:

* ``recall_any@k``: some gold id is among the first ``k`` ranked ids;
* ``recall_all@k``: every gold id is among them (``all([])`` is 1 there too: questions with no
  gold user turn are therefore left out of the averages, see :func:`aggregate_lme`);
* ``ndcg_any@k``: binary relevance per corpus item, ``dcg(rel, k) = rel[0] + sum_{i>=1} rel[i] /
  log2(i + 1)`` (0-based ``i``) over the first ``k``, divided by the DCG of all corpus relevances sorted
  descending (0 when that is 0);
* turn-to-session: every id (gold and corpus) becomes its session, so the corpus repeats a
  session once per unit, and ``k`` grows to the first prefix of the ranking that holds ``k``
  distinct sessions (up to the corpus length + 1) before the three metrics are taken at that
  grown ``k``. A LongMemEval id's session is :func:`session_of` (the official rule, repeated
  sessions merged); other banks' ids (LoCoMo's ``D3:5``, your own) carry no session, so their
  session is the turn's own session number (:func:`unit_sessions`).

For a selected *set* (TrawMem, or any baseline cut at B), the ranking is the selection order,
so metrics at ``k > B`` see the whole set. Averages skip abstention questions (``_abs`` in the
id) and questions without gold, as the official script skips the former.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from ..data.longmemeval import QUESTION_TYPES, is_abstention, session_of

DEFAULT_KS = (1, 3, 5, 10, 30, 50)
OFFICIAL = ("recall_any", "recall_all", "ndcg_any")
OURS = ("evidence_recall", "all_evidence_hit", "context_tokens")


def dcg(relevances: Sequence[float], k: int) -> float:
    """Discounted cumulative gain of the first ``k`` relevances (position 1 undiscounted)."""
    rel = list(relevances)[:k]
    if not rel:
        return 0.0
    return float(rel[0]) + sum(r / math.log2(j) for j, r in enumerate(rel[1:], start=2))


def _evaluate(rank_idx: Sequence[int], gold: set[str], corpus: Sequence[str], k: int) -> tuple[float, float, float]:
    """The official ``evaluate_retrieval`` on corpus positions ``rank_idx``."""
    recalled = {corpus[i] for i in rank_idx[:k]}
    r_any = float(any(g in recalled for g in gold))
    r_all = float(all(g in recalled for g in gold))
    rel = [1 if c in gold else 0 for c in corpus]
    ideal = dcg(sorted(rel, reverse=True), k)
    ndcg = dcg([rel[i] for i in rank_idx[:k]], k) / ideal if ideal else 0.0
    return r_any, r_all, ndcg


def _positions(ranked: Sequence[str], corpus: Sequence[str]) -> list[int]:
    pos = {c: i for i, c in enumerate(corpus)}
    missing = [r for r in ranked if r not in pos]
    if missing:
        raise ValueError(f"ranked ids not in the corpus: {missing[:3]}")
    return [pos[r] for r in ranked]


def turn_metrics(ranked: Sequence[str], gold: Iterable[str], corpus: Sequence[str], k: int):
    """(recall_any, recall_all, ndcg_any) at ``k``, turn level."""
    return _evaluate(_positions(ranked, corpus), set(gold), corpus, k)


def unit_sessions(ids: Sequence[str], sessions: Sequence[int]) -> list[str]:
    """The session label of each unit for the turn-to-session metric, from its id and its turn's
    session number: LongMemEval's ``{session_id}_{turn}`` ids (each session part lies in one
    session; an answer session holds two, ``answer_...`` and ``noans_...``, as in the official
    script) give :func:`session_of`; any other ids (LoCoMo's ``D3:5``, which hold no ``_``, or
    ids whose part before the last ``_`` spans sessions) give the session number."""
    prefix = [i.rsplit("_", 1)[0] if "_" in i else None for i in ids]
    if None not in prefix and len(set(zip(prefix, sessions))) == len(set(prefix)):
        return [session_of(i) for i in ids]
    return [f"session {s}" for s in sessions]


def session_metrics(ranked: Sequence[str], gold: Iterable[str], corpus: Sequence[str], k: int,
                    sessions: Sequence[str] | None = None):
    """(recall_any, recall_all, ndcg_any) at ``k``, turn-to-session (k grown to k distinct sessions).

    :param sessions: the corpus units' session labels (:func:`unit_sessions`); by default
        LongMemEval's :func:`session_of` of each id
    """
    idx = _positions(ranked, corpus)
    sess = list(sessions) if sessions is not None else [session_of(c) for c in corpus]
    label = dict(zip(corpus, sess))
    # a gold id outside the corpus keeps a session of its own (it can never be retrieved)
    gold_s = {label.get(g, "\x00" + g) if sessions is not None else session_of(g) for g in gold}
    n = len(sess)
    eff = k
    if k <= n:
        # the official loop: grow while the prefix holds fewer than k sessions and eff <= n
        seen: set[str] = set()
        counts = []  # counts[e - 1] = distinct sessions among the first e ranked ids
        for i in idx:
            seen.add(sess[i])
            counts.append(len(seen))
        distinct = lambda e: counts[min(e, len(counts)) - 1] if counts else 0  # noqa: E731
        while eff <= n and distinct(eff) < k:
            eff += 1
    return _evaluate(idx, gold_s, sess, eff)


def official_metrics(ranked: Sequence[str], gold: Iterable[str], corpus: Sequence[str],
                     ks: Sequence[int] = DEFAULT_KS, sessions: Sequence[str] | None = None) -> dict:
    """``{"turn": {"recall_any@k": ..}, "session": {..}}`` for every ``k`` in ``ks``."""
    gold = list(gold)
    out: dict = {"turn": {}, "session": {}}
    for k in ks:
        for name, v in zip(OFFICIAL, turn_metrics(ranked, gold, corpus, k)):
            out["turn"][f"{name}@{k}"] = v
        for name, v in zip(OFFICIAL, session_metrics(ranked, gold, corpus, k, sessions)):
            out["session"][f"{name}@{k}"] = v
    return out


def question_record(qid: str, qtype: str | None, ranked: Sequence[str], gold: Sequence[str],
                    corpus: Sequence[str], tokens: int, ks: Sequence[int] = DEFAULT_KS,
                    sessions: Sequence[str] | None = None) -> dict:
    """Everything scored for one question: the official metrics and evidence recall / hit / tokens.

    :param sessions: the corpus units' session labels (:func:`unit_sessions`)
    """
    g, s = set(gold), set(ranked)
    rec = {"qid": qid, "qtype": qtype, "abstention": is_abstention(qid), "n_gold": len(g),
           "n_selected": len(ranked), "context_tokens": int(tokens),
           "evidence_recall": len(g & s) / len(g) if g else float("nan"),
           "all_evidence_hit": float(g <= s) if g else float("nan")}
    if g:
        rec["official"] = official_metrics(ranked, gold, corpus, ks, sessions)
    return rec


def scored(records: Iterable[dict]) -> list[dict]:
    """Records the retrieval metrics average over: not abstention, with gold."""
    return [r for r in records if not r["abstention"] and r["n_gold"] > 0]


def _mean(rows: list[dict], key) -> float:
    return float(np.mean([key(r) for r in rows])) if rows else float("nan")


def aggregate_lme(records: list[dict]) -> dict:
    """Official metrics (mean over scored questions, as the official script) and our metrics
    macro-averaged over question types, with a per-type table of both."""
    rows = scored(records)
    types = [t for t in QUESTION_TYPES if any(r["qtype"] == t for r in rows)]
    types += sorted({r["qtype"] for r in rows if r["qtype"] not in QUESTION_TYPES and r["qtype"]})

    def official_mean(rs):
        if not rs:
            return {}
        return {lvl: {m: _mean(rs, lambda r, lvl=lvl, m=m: r["official"][lvl][m]) for m in rs[0]["official"][lvl]}
                for lvl in ("turn", "session")}

    per_type = {}
    for t in types:
        rs = [r for r in rows if r["qtype"] == t]
        per_type[t] = {k: _mean(rs, lambda r, k=k: r[k]) for k in OURS} | {"n": len(rs),
                                                                           "official": official_mean(rs)}
    macro = {k: float(np.mean([per_type[t][k] for t in types])) for k in OURS} if types else {}
    macro_official = {}
    if types:
        for lvl in ("turn", "session"):
            names = per_type[types[0]]["official"].get(lvl, {})
            macro_official[lvl] = {m: float(np.mean([per_type[t]["official"][lvl][m] for t in types])) for m in names}
    return {
        "official": official_mean(rows), "macro": macro, "macro_official": macro_official, "per_type": per_type,
        "n_scored": len(rows), "n_questions": len(records),
        "skipped_abstention": sum(1 for r in records if r["abstention"]),
        "skipped_no_gold": sum(1 for r in records if not r["abstention"] and r["n_gold"] == 0),
    }
