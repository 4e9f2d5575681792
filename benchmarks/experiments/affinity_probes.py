"""Probes for the learned affinity that were tried and NOT shipped (issue 12): extra unit cues,
thread / session cues, query-adaptive fusion, other fitting losses, non-linear models (a small
MLP, boosted trees) and packing by relevance per token, under the same fold protocol as ``bench_equal_tokens.py`` (each fold's
weights fitted on the other 11 folds of both dev sets), scored on the affinity's ranking alone,
filled to T in rank order (LoCoMo T = 800, LongMemEval T = 400; macro evidence recall).

    python -m benchmarks.experiments.affinity_probes [--out benchmarks/results/archive/affinity_probes.json]

The ranking-alone score of the shipped features reproduces the "alpha ranking only" ablation of
``equal_tokens.json`` (0.630 / 0.676), so a probe's gain there is the gain it could bring. An
oracle row packs each question's gold units cheapest first into T: what the budget itself allows.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from trawmem_gpu.head.relevance import row_weights

from .. import harness

TARGET_T = {"locomo": 800, "longmemeval": 400}
FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|my|mine|myself|we|our|us)\b", re.I)
WORD = re.compile(r"\w+")


def unit_cues(bank) -> np.ndarray:
    """[N, 3]: first-person word rate, asks a question, log(1 + words)."""
    rows = []
    for t in bank.turns:
        n = len(WORD.findall(t.text)) or 1
        rows.append((len(FIRST_PERSON.findall(t.text)) / n, 1.0 if "?" in t.text else 0.0, np.log1p(n)))
    return np.array(rows)


def thread_cues(bank, F, z) -> np.ndarray:
    """[N, 3]: the largest fused rank feature (``rrf_cos + rrf_bm25``) in v's thread and in v's
    session, and the cosine of the question to v's thread head."""
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    fused = F[:, RELEVANCE_FEATURES.index("rrf_cos")] + F[:, RELEVANCE_FEATURES.index("rrf_bm25")]
    th = bank.unit_thread.astype(np.int64)
    _, sess = np.unique([t.session for t in bank.turns], return_inverse=True)
    tmax = np.full(th.max() + 1, -np.inf)
    np.maximum.at(tmax, th, fused)
    smax = np.full(sess.max() + 1, -np.inf)
    np.maximum.at(smax, sess, fused)
    return np.column_stack([tmax[th], smax[sess], (bank.head_vecs.astype(np.float64) @ np.asarray(z, np.float64))[th]])


def query_adaptive(F, raw_bm25) -> np.ndarray:
    """[N, 12]: the six similarity features (cos, bm25, rrf_*, top_*) times two descriptors of the
    question over its bank (log(1 + the largest raw BM25), the share of units with a BM25 match),
    so that the fit can shift between dense and lexical evidence by question (z-scored later)."""
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    cols = [RELEVANCE_FEATURES.index(k) for k in ("cos", "bm25", "rrf_cos", "rrf_bm25", "top_cos", "top_bm25")]
    g = (np.log1p(raw_bm25.max()), float((raw_bm25 > 0).mean()))
    return np.concatenate([F[:, cols] * x for x in g], axis=1), np.array(g)


def prf_cos(bank, F, k: int) -> np.ndarray:
    """Cosine of each unit to the mean of the top-k units by the fused rank features."""
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    fused = F[:, RELEVANCE_FEATURES.index("rrf_cos")] + F[:, RELEVANCE_FEATURES.index("rrf_bm25")]
    E = bank.unit_vecs.astype(np.float64)
    c = E[np.argsort(-fused, kind="stable")[:k]].mean(axis=0)
    return E @ (c / np.linalg.norm(c))


def _lbfgs(params, closure):
    opt = torch.optim.LBFGS(params, max_iter=400, history_size=20, line_search_fn="strong_wolfe")
    opt.step(closure)


def fit_listwise(qs) -> np.ndarray:
    """Per question, -mean log softmax of the gold units over the bank (datasets weigh the same)."""
    X = np.concatenate([q.F for q in qs])
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    n_ds = defaultdict(int)
    for q in qs:
        n_ds[q.dataset] += 1
    xs = [torch.as_tensor((q.F - mu) / sd) for q in qs]
    gold = [torch.as_tensor(q.y > 0) for q in qs]
    wq = [1.0 / n_ds[q.dataset] for q in qs]
    beta = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)

    def closure():
        beta.grad = None
        loss = sum(w * -(torch.log_softmax(x @ beta, 0)[g]).mean() for x, g, w in zip(xs, gold, wq))
        loss = loss / sum(wq) + 0.005 * (beta * beta).sum()
        loss.backward()
        return loss

    _lbfgs([beta], closure)
    return beta.detach().numpy() / sd


def fit_mlp(qs, hidden: int = 16, wd: float = 1e-3) -> "callable":
    """A one-hidden-layer GELU network on the features instead of the logistic (same loss and
    question weights)."""
    X = np.concatenate([q.F for q in qs])
    y = (np.concatenate([q.y for q in qs]) > 0).astype(np.float32)
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    Xt, yt, wt = (torch.as_tensor(a, dtype=torch.float32) for a in ((X - mu) / sd, y, row_weights(qs)))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 1))

    def closure():
        net.zero_grad()
        s = net(Xt).squeeze(1)
        loss = (wt * torch.nn.functional.binary_cross_entropy_with_logits(s, yt, reduction="none")).mean()
        loss = loss + wd * sum((p * p).sum() for n, p in net.named_parameters() if "weight" in n)
        loss.backward()
        return loss

    _lbfgs(list(net.parameters()), closure)

    def score(F):
        with torch.no_grad():
            return net(torch.as_tensor((F - mu) / sd, dtype=torch.float32)).squeeze(1).double().numpy()
    return score


def fit_boosted(qs):
    """Gradient-boosted trees (scikit-learn's HistGradientBoostingClassifier) on the features;
    ``None`` when scikit-learn is not installed (it is not a dependency)."""
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
    except ImportError:
        return None
    X = np.concatenate([q.F for q in qs])
    y = np.concatenate([q.y for q in qs]) > 0
    m = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, max_leaf_nodes=15, l2_regularization=1.0,
                                       random_state=0)
    m.fit(X, y, sample_weight=row_weights(qs))
    return m.decision_function


def fit_hard_negatives(qs, lam: float = 5.0, k: int = 20) -> np.ndarray:
    """The shipped logistic fit, refitted with each question's top-k negatives (by the first fit)
    weighted ``lam`` times."""
    from trawmem_gpu.head.relevance import fit_relevance

    w0 = np.asarray(fit_relevance(qs))
    X = np.concatenate([q.F for q in qs])
    y = np.concatenate([q.y for q in qs])
    n_ds = defaultdict(int)
    for q in qs:
        n_ds[q.dataset] += 1
    ws = []
    for q in qs:
        w = np.full(len(q.y), 1.0 / len(q.y) / n_ds[q.dataset])
        neg = np.flatnonzero(q.y == 0)
        w[neg[np.argsort(-(q.F[neg] @ w0[:-1]), kind="stable")[:k]]] *= lam
        ws.append(w)
    w = np.concatenate(ws)
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    Xt, yt, wt = (torch.as_tensor(a) for a in ((X - mu) / sd, y, w / w.mean()))
    beta = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
    b0 = torch.zeros((), dtype=torch.float64, requires_grad=True)

    def closure():
        beta.grad = b0.grad = None
        s = Xt @ beta + b0
        loss = (wt * torch.nn.functional.binary_cross_entropy_with_logits(s, yt, reduction="none")).sum()
        loss = loss + 0.5 * (beta * beta).sum()
        loss.backward()
        return loss

    _lbfgs([beta, b0], closure)
    return beta.detach().numpy() / sd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=harness.dev_data("locomo"))
    ap.add_argument("--lme", type=Path, default=harness.dev_data("longmemeval"))
    ap.add_argument("--out", type=Path, help="result file (default: affinity_probes.json in results/archive)")
    a = ap.parse_args()
    out = harness.out_file(a.out, "affinity_probes.json", harness.ARCHIVE)
    paths = {"locomo": harness.require_data(a.locomo, "locomo", "--locomo"),
             "longmemeval": harness.require_data(a.lme, "longmemeval", "--lme")}
    with harness.pin_threads(1):
        return run(paths, out)


def gold_oracle(data: dict) -> dict:
    """The budget's own limit per data set: gold units packed cheapest first, date headings paid."""
    oracle = {}
    for name, ((qs, ctxs), T) in data.items():
        per = defaultdict(list)
        for q in qs:
            c, b = ctxs[q.bank_id].token_costs("date"), ctxs[q.bank_id].bank
            gold = np.flatnonzero(q.y > 0)
            used, seen, got = 0, set(), 0
            for u in gold[np.argsort(c.unit[gold], kind="stable")]:
                j = int(b.unit_thread[u])
                cost = int(c.unit[u]) + (0 if j in seen else int(c.heading[j]))
                if used + cost <= T:
                    used, got = used + cost, got + 1
                    seen.add(j)
            per[q.category].append(got / len(gold))
        oracle[f"{name}@{T}"] = float(np.mean([np.mean(v) for v in per.values()]))
    return oracle


def run(paths: dict, out: Path) -> int:
    from trawmem_gpu.head.relevance import fit_relevance, load_labelled
    from trawmem_gpu.select.baselines import take_within_tokens

    data = {name: (load_labelled(path, dataset=name), TARGET_T[name]) for name, path in paths.items()}
    allq = []
    for (qs, ctxs), _ in data.values():
        for q in qs:
            bank = ctxs[q.bank_id].bank
            q.extra["F0"] = q.F
            inter, _ = query_adaptive(q.F, ctxs[q.bank_id].bm25.scores(q.extra["question"]))
            q.extra["cues"] = np.column_stack([unit_cues(bank), prf_cos(bank, q.F, 3), prf_cos(bank, q.F, 5),
                                               thread_cues(bank, q.F, q.extra["z"]), inter])
        allq += qs
    groups = sorted({q.group for q in allq})

    def linear(fit):  # a fit returning weights -> a scorer (the bias does not rank)
        def f(qs):
            w = np.asarray(fit(qs))[: qs[0].F.shape[1]]
            return lambda F: F @ w
        return f

    logistic = linear(fit_relevance)

    def calibrated_per_token(gamma):  # rank by log p(v) - gamma log cost(v): expected recall per token
        def f(qs):
            w = np.asarray(fit_relevance(qs))
            return lambda F, cost: -np.logaddexp(0.0, -(F @ w[:-1] + w[-1])) - gamma * np.log(cost)
        return f

    probes = [("shipped features, logistic (as shipped)", [], logistic),
              ("+ first-person rate", [0], logistic), ("+ asks a question", [1], logistic),
              ("+ log length", [2], logistic), ("+ PRF cosine, top 3", [3], logistic),
              ("+ PRF cosine, top 5", [4], logistic),
              ("listwise softmax loss", [], linear(fit_listwise)), ("hard negatives x5", [], linear(fit_hard_negatives)),
              ("+ largest fused rank in the thread", [5], logistic),
              ("+ largest fused rank in the session", [6], logistic), ("+ cosine to the thread head", [7], logistic),
              ("+ query-adaptive fusion (6 features x 2 question descriptors)", list(range(8, 20)), logistic),
              ("MLP, 16 hidden units", [], fit_mlp), ("gradient-boosted trees (scikit-learn)", [], fit_boosted),
              ("packed by p / cost^0.5 (calibrated p)", [], calibrated_per_token(0.5)),
              ("packed by p / cost (calibrated p)", [], calibrated_per_token(1.0))]
    res = {"protocol": __doc__, "probes": []}
    for label, cols, fitter in probes:
        for q in allq:
            q.F = np.column_stack([q.extra["F0"], q.extra["cues"][:, cols]]) if cols else q.extra["F0"]
        if cols:  # the cues on the scale of the rest (the fits z-score anyway; keeps LBFGS well posed)
            X = np.concatenate([q.F for q in allq])
            mu, sd = X.mean(0), np.where(X.std(0) > 0, X.std(0), 1.0)
            for q in allq:
                q.F = (q.F - mu) / sd
        W = {g: fitter([q for q in allq if q.group != g]) for g in groups}
        if any(w is None for w in W.values()):
            print(f"{label}: skipped (scikit-learn is not installed)", flush=True)
            res["probes"].append({"probe": label, "skipped": "scikit-learn is not installed"})
            continue
        row = {"probe": label}
        for name, ((qs, ctxs), T) in data.items():
            per = defaultdict(list)
            for q in qs:
                ctx = ctxs[q.bank_id]
                per_token = label.startswith("packed")
                s = W[q.group](q.F, ctx.token_costs("none").unit.astype(np.float64)) if per_token else W[q.group](q.F)
                order = np.lexsort((np.arange(len(s)), -s))
                u = take_within_tokens(order, ctx.token_costs("none"), ctx.bank.unit_thread, T, "skip")
                g = q.y > 0
                per[q.category].append(float(g[u].sum() / g.sum()))
            row[f"{name}@{T}"] = float(np.mean([np.mean(v) for v in per.values()]))
        res["probes"].append(row)
        print(" | ".join(f"{k} {v:.4f}" if isinstance(v, float) else v for k, v in row.items()), flush=True)
    res["oracle_gold_packed_cheapest_first"] = oracle = gold_oracle(data)
    print("oracle (gold packed cheapest first):", oracle)
    print(f"-> {harness.save(out.stem, res, out_dir=out.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
