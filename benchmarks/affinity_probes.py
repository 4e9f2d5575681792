"""Probes for the learned affinity that were tried and NOT shipped (issue 12): extra unit cues and
other fitting losses, under the same fold protocol as ``bench_equal_tokens.py`` (each fold's
weights fitted on the other 11 folds of both dev sets), scored on the affinity's ranking alone,
filled to T in rank order (LoCoMo T = 800, LongMemEval T = 400; macro evidence recall).

    python benchmarks/affinity_probes.py [--out benchmarks/results/affinity_probes.json]

The ranking-alone score of the shipped features reproduces the "alpha ranking only" ablation of
``equal_tokens.json`` (0.630 / 0.676), so a probe's gain there is the gain it could bring. An
oracle row packs each question's gold units cheapest first into T: what the budget itself allows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
SETS = (("locomo", DATA / "locomo" / "locomo_dev.json", 800),
        ("longmemeval", DATA / "longmemeval" / "longmemeval_s_dev.json.gz", 400))
FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|my|mine|myself|we|our|us)\b", re.I)
WORD = re.compile(r"\w+")


def unit_cues(bank) -> np.ndarray:
    """[N, 3]: first-person word rate, asks a question, log(1 + words)."""
    rows = []
    for t in bank.turns:
        n = len(WORD.findall(t.text)) or 1
        rows.append((len(FIRST_PERSON.findall(t.text)) / n, 1.0 if "?" in t.text else 0.0, np.log1p(n)))
    return np.array(rows)


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
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "affinity_probes.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from trawmem_gpu.head.relevance import fit_relevance, load_labelled
    from trawmem_gpu.select.baselines import take_within_tokens

    data = {name: (load_labelled(path, dataset=name), T) for name, path, T in SETS}
    allq = []
    for (qs, ctxs), _ in data.values():
        for q in qs:
            bank = ctxs[q.bank_id].bank
            q.extra["F0"] = q.F
            q.extra["cues"] = np.column_stack([unit_cues(bank), prf_cos(bank, q.F, 3), prf_cos(bank, q.F, 5)])
        allq += qs
    groups = sorted({q.group for q in allq})
    logistic = lambda qs: np.asarray(fit_relevance(qs))[:-1]  # noqa: E731 (the bias does not rank)
    probes = [("shipped features, logistic (as shipped)", [], logistic),
              ("+ first-person rate", [0], logistic), ("+ asks a question", [1], logistic),
              ("+ log length", [2], logistic), ("+ PRF cosine, top 3", [3], logistic),
              ("+ PRF cosine, top 5", [4], logistic),
              ("listwise softmax loss", [], fit_listwise), ("hard negatives x5", [], fit_hard_negatives)]
    res = {"protocol": __doc__, "probes": []}
    for label, cols, fitter in probes:
        for q in allq:
            q.F = np.column_stack([q.extra["F0"], q.extra["cues"][:, cols]]) if cols else q.extra["F0"]
        W = {g: fitter([q for q in allq if q.group != g]) for g in groups}
        row = {"probe": label}
        for name, ((qs, ctxs), T) in data.items():
            per = defaultdict(list)
            for q in qs:
                s = q.F @ W[q.group]
                ctx = ctxs[q.bank_id]
                order = np.lexsort((np.arange(len(s)), -s))
                u = take_within_tokens(order, ctx.token_costs("none"), ctx.bank.unit_thread, T, "skip")
                g = q.y > 0
                per[q.category].append(float(g[u].sum() / g.sum()))
            row[f"{name}@{T}"] = float(np.mean([np.mean(v) for v in per.values()]))
        res["probes"].append(row)
        print(" | ".join(f"{k} {v:.4f}" if isinstance(v, float) else v for k, v in row.items()), flush=True)
    oracle = {}  # the budget's own limit: gold units packed cheapest first, date headings paid
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
    res["oracle_gold_packed_cheapest_first"] = oracle
    print("oracle (gold packed cheapest first):", oracle)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
