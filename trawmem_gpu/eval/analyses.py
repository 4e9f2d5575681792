"""The paper's retrieval-side analyses (Sections 5.4-5.8 and 6) as metric definitions.

Every function takes plain arrays (bank unit indices, thread ids, vectors, per-query values),
so one definition serves ``trawmem sweep``, ``benchmarks/paper_analyses.py`` and the tests on
hand-made banks:

- :func:`reduction_ratio`: workspace compression ``c_q = 1 - |S_q| / |U_q|`` (Fig. 8);
- :func:`cluster_bootstrap`: confidence intervals resampling whole conversations (Figs. 8, 11);
- :func:`load_observation_facts`, :func:`fact_mentions`, :func:`relevant_facts`,
  :func:`fact_coverage`: distinct relevant facts retained and repeated fact mentions (Fig. 9),
  from LoCoMo's per-session ``observation`` facts, which cite the turns they come from;
- :func:`thread_usage`: distinct threads per workspace and units per used thread (Fig. 12);
- :func:`anchor_bridge_pairs`: the (unit, direct question, bridging question) pairs of Fig. 7;
- :func:`pareto_mask`: the Pareto-optimal cells of a (quality, cost) sweep;
- :func:`describe`: mean, median and the tail percentiles every figure quotes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InputError, read_json

PERCENTILES = (50, 90, 95, 99)


def describe(values) -> dict:
    """``{n, mean, median, p90, p95, p99, min, max}`` of ``values`` (percentiles: linear
    interpolation, numpy's default); NaNs for an empty input."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"n": 0, **{k: float("nan") for k in ("mean", "median", "p90", "p95", "p99", "min", "max")}}
    p = np.percentile(v, PERCENTILES)
    return {"n": int(v.size), "mean": float(v.mean()), "median": float(p[0]), "p90": float(p[1]),
            "p95": float(p[2]), "p99": float(p[3]), "min": float(v.min()), "max": float(v.max())}


# ----------------------------------------------------------------------------------------------
# Fig. 8: workspace compression

def reduction_ratio(n_selected: int, n_candidates: int) -> float:
    """``c_q = 1 - |S_q| / |U_q|``: the share of the candidate units left out of the workspace."""
    if n_candidates <= 0:
        raise ValueError("the reduction ratio needs at least one candidate unit (|U_q| = 0)")
    if not 0 <= n_selected <= n_candidates:
        raise ValueError(f"|S_q| = {n_selected} must lie in [0, |U_q| = {n_candidates}]")
    return 1.0 - n_selected / n_candidates


def cluster_bootstrap(values, clusters, stat: Callable[[np.ndarray], float] = np.mean, n_boot: int = 2000,
                      level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``(estimate, lo, hi)``: ``stat`` of ``values`` and its percentile bootstrap interval,
    resampling whole clusters (conversations, the paper's "roots") with replacement and
    pooling their values, so questions of one conversation are never treated as independent."""
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(clusters)
    if v.shape != c.shape or v.ndim != 1:
        raise ValueError("values and clusters must be 1-D and of the same length")
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level} must lie in (0, 1)")
    keys, inv = np.unique(c, return_inverse=True)
    groups = [v[inv == k] for k in range(len(keys))]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(groups), size=(n_boot, len(groups)))
    if stat is np.mean:  # sums and counts: no concatenation per resample
        sums = np.array([g.sum() for g in groups])
        counts = np.array([len(g) for g in groups])
        boot = sums[draws].sum(1) / counts[draws].sum(1)
    else:
        boot = np.array([stat(np.concatenate([groups[k] for k in row])) for row in draws])
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [a, 1.0 - a])
    return float(stat(v)), float(lo), float(hi)


# ----------------------------------------------------------------------------------------------
# Fig. 9: fact coverage and redundancy

@dataclass
class BankFacts:
    """The observation facts of one conversation: text (in memory only, never written out) and
    the bank unit indices of the turns each fact cites."""

    bank_id: str
    texts: list[str]
    cited: list[np.ndarray]
    """Per fact: sorted bank unit indices of its cited turns (never empty)."""
    sessions: list[int]
    dropped: dict = field(default_factory=dict)
    """Counts of facts left out: ``no_known_turn`` (no citation names a turn of the bank)."""

    def __len__(self) -> int:
        return len(self.texts)


def load_observation_facts(path: str | Path, turn_index: dict[str, dict[str, int]]) -> dict[str, BankFacts]:
    """LoCoMo's per-session ``observation`` facts, read from the raw JSON.

    Each sample's ``observation`` maps ``session_N_observation`` to ``{speaker: [[fact, cite],
    ...]}``, where ``cite`` is a turn id (``"D3:7"``), several ids in one string, or a list of
    ids. Citations go through the same tolerant id parser as evidence
    (:func:`~trawmem_gpu.data.evidence.parse_evidence`); facts whose citations name no turn of
    the bank are dropped and counted. ``turn_index``: bank id -> {turn id: unit index} (from
    ``Bank.index_of()``); samples not in it are skipped.
    """
    from ..data.evidence import parse_evidence
    from ..data.types import EvidenceRepairs

    path = Path(path)
    data = read_json(path, str(path), "not a LoCoMo JSON file")
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of samples")
    out: dict[str, BankFacts] = {}
    for i, sample in enumerate(data):
        sid = sample.get("sample_id") if isinstance(sample, dict) else None
        if sid not in turn_index:
            continue
        where = f"{path}: sample {i} ({sid!r})"
        obs = sample.get("observation")
        if not isinstance(obs, dict):
            raise InputError(f"{where}: no 'observation' object; the fact analysis needs LoCoMo's per-session "
                             "observation facts")
        idx = turn_index[sid]
        known = set(idx)
        facts = BankFacts(sid, [], [], [], {"no_known_turn": 0})
        rep = EvidenceRepairs()
        for key in sorted(obs, key=_session_number):
            per_speaker = obs[key]
            if not isinstance(per_speaker, dict):
                raise InputError(f"{where}: field 'observation.{key}' must map speakers to fact lists")
            for speaker, items in per_speaker.items():
                if not isinstance(items, list):
                    raise InputError(f"{where}: field 'observation.{key}.{speaker}' must be a list")
                for j, item in enumerate(items):
                    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                        raise InputError(f"{where}: field 'observation.{key}.{speaker}[{j}]' must be "
                                         "[fact text, cited turn id(s)]")
                    ids = parse_evidence(item[1], known, rep)
                    if not ids:
                        facts.dropped["no_known_turn"] += 1
                        continue
                    facts.texts.append(item[0])
                    facts.cited.append(np.array(sorted({idx[t] for t in ids}), dtype=np.int64))
                    facts.sessions.append(_session_number(key))
        facts.dropped["citation_repairs"] = rep.as_dict()
        out[sid] = facts
    return out


def _session_number(key: str) -> int:
    digits = "".join(ch if ch.isdigit() else " " for ch in key).split()
    return int(digits[0]) if digits else 0


def citation_matrix(cited: list[np.ndarray], n_units: int) -> np.ndarray:
    """``[F, N]`` bool: unit ``u`` mentions fact ``f`` exactly when ``f`` cites ``u``."""
    M = np.zeros((len(cited), n_units), dtype=bool)
    for f, c in enumerate(cited):
        M[f, c] = True
    return M


def fact_mentions(fact_vecs: np.ndarray, unit_vecs: np.ndarray, cited: list[np.ndarray]) -> tuple[np.ndarray, float]:
    """``([F, N] bool, theta)``: which units mention which facts.

    A unit mentions fact ``f`` when ``f`` cites it, or when the unit is at least as close to
    the fact (cosine of unit-norm vectors) as ``f``'s own best cited turn *and* at least
    ``theta``, the median over the bank's facts of that own-source cosine. So a unit counts as
    a restatement only if it matches the fact as well as the fact's source does and as well as
    a typical source matches its fact; no hand-set threshold.
    """
    if len(cited) == 0:
        return np.zeros((0, len(unit_vecs)), dtype=bool), float("nan")
    S = np.asarray(fact_vecs, dtype=np.float64) @ np.asarray(unit_vecs, dtype=np.float64).T
    own = np.array([S[f, c].max() for f, c in enumerate(cited)])
    theta = float(np.median(own))
    M = S >= np.maximum(own, theta)[:, None]
    return M | citation_matrix(cited, S.shape[1]), theta


def relevant_facts(cited: list[np.ndarray], gold_units) -> np.ndarray:
    """Indices of the facts relevant to a question: those citing at least one of its gold
    evidence turns (``gold_units``: bank unit indices)."""
    g = np.asarray(list(gold_units), dtype=np.int64)
    return np.array([f for f, c in enumerate(cited) if np.isin(c, g).any()], dtype=np.int64)


def fact_coverage(selected, mentions: np.ndarray, relevant) -> tuple[int, int]:
    """``(retained, repeats)`` of one selection ``selected`` (bank unit indices).

    - retained: relevant facts mentioned by at least one selected unit;
    - repeats: over *all* facts of the bank, every selected unit beyond the first that
      mentions a fact already mentioned, i.e. ``sum_f max(0, |{u in S: u mentions f}| - 1)``.
    """
    s = np.unique(np.asarray(list(selected), dtype=np.int64))
    if mentions.shape[0] == 0 or s.size == 0:
        return 0, 0
    counts = mentions[:, s].sum(axis=1)
    rel = np.asarray(relevant, dtype=np.int64)
    retained = int((counts[rel] > 0).sum()) if rel.size else 0
    return retained, int(np.maximum(counts - 1, 0).sum())


# ----------------------------------------------------------------------------------------------
# Fig. 12: threads per workspace

def thread_usage(selected, unit_thread: np.ndarray) -> tuple[int, float]:
    """``(distinct threads, units per used thread)`` of one selection (bank unit indices)."""
    s = np.unique(np.asarray(list(selected), dtype=np.int64))
    if s.size == 0:
        return 0, float("nan")
    n = len(np.unique(np.asarray(unit_thread)[s]))
    return n, s.size / n


# ----------------------------------------------------------------------------------------------
# Fig. 7: role shifts of one unit between two questions

@dataclass(frozen=True)
class RolePair:
    """Unit ``unit`` of bank ``bank_id`` is the only gold turn of ``q_direct`` (it answers it
    directly) and one of several gold turns of ``q_bridge`` (it must be combined with others)."""

    bank_id: str
    unit: int
    q_direct: str
    q_bridge: str


def anchor_bridge_pairs(questions: list[dict], require_selected: bool = True) -> list[RolePair]:
    """The paired samples of Fig. 7 from gold evidence, without an LLM.

    ``questions``: dicts with ``qid``, ``bank_id``, ``gold`` (bank unit indices) and
    ``selected`` (bank unit indices). A pair ``(v, q_A, q_B)`` has ``gold(q_A) = {v}`` and
    ``v`` in ``gold(q_B)`` with ``|gold(q_B)| >= 2``, in the same bank; with
    ``require_selected`` ``v`` must be selected by both questions (so both have role weights
    for it from a workspace they actually built). Sorted by (bank, unit, q_A, q_B).
    """
    by_unit_direct: dict[tuple[str, int], list[dict]] = {}
    by_unit_bridge: dict[tuple[str, int], list[dict]] = {}
    for q in questions:
        gold = sorted(set(int(u) for u in q["gold"]))
        for v in gold:
            (by_unit_direct if len(gold) == 1 else by_unit_bridge).setdefault((q["bank_id"], v), []).append(q)
    out = []
    for key in sorted(set(by_unit_direct) & set(by_unit_bridge)):
        bank_id, v = key
        for qa in by_unit_direct[key]:
            for qb in by_unit_bridge[key]:
                if require_selected and not (v in set(qa["selected"]) and v in set(qb["selected"])):
                    continue
                out.append(RolePair(bank_id, v, qa["qid"], qb["qid"]))
    return sorted(out, key=lambda p: (p.bank_id, p.unit, p.q_direct, p.q_bridge))


# ----------------------------------------------------------------------------------------------
# Pareto set of a sweep

def pareto_mask(gain, cost) -> np.ndarray:
    """``[n]`` bool: point ``i`` is Pareto-optimal when no other point has ``gain >= gain_i`` and
    ``cost <= cost_i`` with at least one strict. Equal points are all optimal; points with a NaN
    coordinate are never optimal and never dominate."""
    g = np.asarray(gain, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    if g.shape != c.shape or g.ndim != 1:
        raise ValueError("gain and cost must be 1-D and of the same length")
    ok = np.isfinite(g) & np.isfinite(c)
    ge = (g[None, :] >= g[:, None]) & (c[None, :] <= c[:, None])
    strict = (g[None, :] > g[:, None]) | (c[None, :] < c[:, None])
    dominated = (ge & strict & ok[None, :]).any(axis=1)
    return ok & ~dominated
