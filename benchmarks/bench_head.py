"""The learned role head on LoCoMo dev: leave-one-conversation-out, then the B table.

    python -m benchmarks run head [--data PATH] [--epochs N] [--seed S]

(a) LOCO: for each dev conversation, a head trained (``train.fit``, the default hyper-parameters)
    on the other six is evaluated on it with the real reference selection (``run_eval``), next to
    the hand-set default and the hybrid (RRF) baseline at B = 16: macro evidence recall, all-evidence
    hit, multi-hop (category 1) all-evidence hit, context tokens. The pooled row scores the seven
    held-out folds' records together (the number comparable to the full-dev tables). Per fold,
    the torch greedy (which picks exactly what the reference picks) also scores the head with
    only one group of its tensors kept (weights / A / M), to see which carries the gain.
(b) table at B in {8, 16, 32}: hand-set default, learned head trained on all seven dev
    conversations at that B (IN-SAMPLE: it has seen these questions; the honest number is the
    LOCO one), the LOCO pooled head at B = 16, cosine, BM25, hybrid; context tokens beside each.

Writes ``benchmarks/results/head_loco.json``, ``head_table.json``, ``head_loco.png`` and the
all-dev B = 16 head ``benchmarks/results/head_dev_B16.safetensors`` (+ its loss curve), and
prints the tables as markdown.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import sys
import time

import numpy as np

from . import harness

BUDGETS = (8, 16, 32)
LOCO_B = 16
CATS = (1, 2, 3, 4)


def _rows_of(convs):
    return [c.bank_id for c in convs for q in c.questions if q.category in CATS and q.evidence]


def _metrics(res) -> dict:
    m = res["macro"]
    return {"evidence_recall": m["evidence_recall"], "all_evidence_hit": m["all_evidence_hit"],
            "multi_hop_hit": res["per_category"].get("1", {}).get("all_evidence_hit", float("nan")),
            "context_tokens": m["context_tokens"], "n": res["n_questions"]}


def _pooled(records) -> dict:
    from trawmem_gpu.eval.retrieval import aggregate

    agg = aggregate(records, categories=CATS)
    return {"evidence_recall": agg["macro"]["evidence_recall"], "all_evidence_hit": agg["macro"]["all_evidence_hit"],
            "multi_hop_hit": agg["per_category"].get("1", {}).get("all_evidence_hit", float("nan")),
            "context_tokens": agg["macro"]["context_tokens"], "n": len(records)}


def _torch_macro(head, items, cfg, params) -> float:
    """Macro evidence recall of the torch greedy (same picks as the reference) over ``items`` at
    ``params.budget``."""
    from trawmem_gpu.head.train import make_batches, torch_picks

    picks = torch_picks(head, make_batches(items, params.budget), cfg, params.budget)
    per: dict[int, list[float]] = {}
    for i, it in enumerate(items):
        per.setdefault(it.category, []).append(float(it.gold[picks[i]].sum()) / it.n_gold)
    return float(np.mean([np.mean(v) for v in per.values()]))


def _keep_only(head, group: str):
    """A copy of ``head`` with only one tensor group learned, the rest at the hand-set start."""
    import torch

    from trawmem_gpu.head import RoleHead

    groups = {"weights": ("s", "S"), "A": ("dA",), "M": ("dM0", "dMr")}
    h = RoleHead(head.cfg, conditional_weights=head.conditional_weights)
    with torch.no_grad():
        for k in groups[group]:
            getattr(h, k).copy_(getattr(head, k))
    return h


def _md(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _f(x, d=3):
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{d}f}"


def loco(data, dev, items, epochs, seed) -> dict:
    from trawmem_gpu.eval.retrieval import run_eval
    from trawmem_gpu.head.defaults import DEFAULTS
    from trawmem_gpu.head.train import fit
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    convs, banks, Z = dev
    rows = np.array(_rows_of(convs))
    cfg, params = SelectConfig(), QueryParams(budget=LOCO_B)
    folds, pooled = [], {"default": [], "head": [], "hybrid": []}
    for c in convs:
        t0 = time.perf_counter()
        held = c.bank_id
        train_items = [it for it, r in zip(items, rows) if r != held]
        test_items = [it for it, r in zip(items, rows) if r == held]
        head, hist = fit(train_items, cfg, epochs=epochs, seed=seed, progress=False, params=params)
        t_train = time.perf_counter() - t0
        kw = dict(progress=False, keep_records=True, banks_and_convs=([c], [b for b in banks if b.bank_id == held]),
                  query_vecs=Z[rows == held], params=params)
        res = {"default": run_eval(data, "trawmem", cfg, **kw), "head": run_eval(data, "trawmem", cfg, head=head, **kw),
               "hybrid": run_eval(data, "hybrid", cfg, **kw)}
        for k, r in res.items():
            pooled[k] += r["records"]
        groups = {g: _torch_macro(_keep_only(head, g), test_items, cfg, params) for g in ("weights", "A", "M")}
        fold = {"held_out": held, "n_questions": len(test_items), "n_train_questions": len(train_items),
                "train_seconds": t_train, "final_loss": hist["epoch_loss"][-1], "first_loss": hist["epoch_loss"][0],
                **{k: _metrics(r) for k, r in res.items()},
                "head_only_group_recall": groups, "head_summary": head.summary(), "head_sha256": head.content_hash()}
        folds.append(fold)
        print(f"fold {held}: default {fold['default']['evidence_recall']:.4f} head {fold['head']['evidence_recall']:.4f} "
              f"hybrid {fold['hybrid']['evidence_recall']:.4f} | multi-hop {fold['default']['multi_hop_hit']:.3f} / "
              f"{fold['head']['multi_hop_hit']:.3f} / {fold['hybrid']['multi_hop_hit']:.3f} | only "
              + " ".join(f"{g} {v:.4f}" for g, v in groups.items()) + f" ({time.perf_counter() - t0:.0f}s)", flush=True)
    return {"budget": LOCO_B, "hyper": DEFAULTS | {"epochs": epochs, "seed": seed}, "folds": folds,
            "pooled": {k: _pooled(v) for k, v in pooled.items()},
            "mean_over_folds": {k: {m: float(np.mean([f[k][m] for f in folds])) for m in
                                    ("evidence_recall", "all_evidence_hit", "multi_hop_hit", "context_tokens")}
                                for k in ("default", "head", "hybrid")}}


def table(data, dev, items, epochs, seed, loco_res, out) -> dict:
    from trawmem_gpu.eval.retrieval import run_eval
    from trawmem_gpu.head import save_head
    from trawmem_gpu.head.train import fit, loss_png_path, plot_loss
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    convs, banks, Z = dev
    cfg = SelectConfig()
    rows, heads = [], {}
    for B in BUDGETS:
        params = QueryParams(budget=B)
        kw = dict(progress=False, keep_records=False, banks_and_convs=(convs, banks), query_vecs=Z, params=params)
        t0 = time.perf_counter()
        head, hist = fit(items, cfg, epochs=epochs, seed=seed, progress=False, params=params)
        head.meta = {"data_sha256": None, "conversations": [c.bank_id for c in convs], "seed": seed, "epochs": epochs,
                     "budget": B, "note": "all dev conversations (in-sample on dev)"}
        from trawmem_gpu.paths import file_sha256

        head.meta["data_sha256"] = file_sha256(data)
        heads[B] = {"summary": head.summary(), "sha256": head.content_hash(), "train_seconds": time.perf_counter() - t0}
        if B == LOCO_B:
            p = out / "head_dev_B16.safetensors"
            save_head(head, p)
            plot_loss(hist, loss_png_path(p), title="role head, all 7 dev conversations, B = 16")
            heads[B]["path"] = str(p.relative_to(harness.ROOT)) if p.is_relative_to(harness.ROOT) else str(p)
        runs = [("trawmem default (hand-set)", run_eval(data, "trawmem", cfg, **kw)),
                ("trawmem + learned head (IN-SAMPLE, all dev)", run_eval(data, "trawmem", cfg, head=head, **kw))]
        runs += [(m, run_eval(data, m, cfg, **kw)) for m in ("cosine", "bm25", "hybrid")]
        for name, r in runs:
            rows.append({"method": name, "budget": B, **_metrics(r)})
        if B == LOCO_B:
            rows.append({"method": "trawmem + learned head (LOCO, held-out, pooled)", "budget": B,
                         **loco_res["pooled"]["head"]})
        print(f"B={B} done ({time.perf_counter() - t0:.0f}s)", flush=True)
    return {"rows": rows, "heads": heads}


def plot(loco_res):
    """The figure: per held-out fold and pooled, recall and multi-hop hit of each method."""
    folds = loco_res["folds"]
    names = [f["held_out"] for f in folds] + ["pooled"]
    fig, axes = harness.figure(1, 2, figsize=(12, 4))
    for ax, metric, title in ((axes[0], "evidence_recall", "macro evidence recall, B=16"),
                              (axes[1], "multi_hop_hit", "multi-hop all-evidence hit, B=16")):
        x = np.arange(len(names))
        for i, (k, lab) in enumerate((("default", "hand-set default"), ("head", "learned head (held out)"),
                                      ("hybrid", "hybrid RRF"))):
            vals = [f[k][metric] for f in folds] + [loco_res["pooled"][k][metric]]
            ax.bar(x + (i - 1) * 0.27, vals, 0.27, label=lab)
        ax.set_xticks(x, names, rotation=30)
        ax.set_title(title)
        lo = min(min(f[k][metric] for f in folds) for k in ("default", "head", "hybrid"))
        ax.set_ylim(max(0.0, lo - 0.08), None)
    axes[0].legend(fontsize=8)
    fig.suptitle("Leave-one-conversation-out: head trained on the other six dev conversations")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.head.defaults import DEFAULTS
    from trawmem_gpu.head.train import load_dev, prepare_items
    from trawmem_gpu.select.config import SelectConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    ap.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    ap.add_argument("--out-dir", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    a = ap.parse_args(argv)
    harness.require_data(a.data)
    out = harness.results_dir(a.out_dir)
    t0 = time.perf_counter()
    dev = load_dev(a.data)
    items = prepare_items(dev[0], dev[1], dev[2], SelectConfig(), progress=False)  # default QueryParams (B = 16)
    print(f"precomputed {len(items)} questions in {time.perf_counter() - t0:.0f}s", flush=True)
    meta = {"data": a.data, "data_sha256": file_sha256(a.data), "encoder": dev[1][0].encoder_id,
            "machine": harness.machine()}
    lres = loco(a.data, dev, items, a.epochs, a.seed) | meta
    harness.save("head_loco", lres, plot(lres), out_dir=out)
    tres = table(a.data, dev, items, a.epochs, a.seed, lres, out) | meta
    tres["note"] = ("The 'learned head (IN-SAMPLE, all dev)' rows use a head trained on every dev question; "
                    "the honest held-out number is the LOCO row (head_loco.json).")
    tres["seconds"] = time.perf_counter() - t0
    harness.save("head_table", tres, out_dir=out)

    fold_rows = [[f["held_out"], f["n_questions"], _f(f["default"]["evidence_recall"], 4), _f(f["head"]["evidence_recall"], 4),
                  _f(f["hybrid"]["evidence_recall"], 4), _f(f["default"]["multi_hop_hit"]), _f(f["head"]["multi_hop_hit"]),
                  _f(f["hybrid"]["multi_hop_hit"])] for f in lres["folds"]]
    p = lres["pooled"]
    fold_rows.append(["pooled", sum(f["n_questions"] for f in lres["folds"]), _f(p["default"]["evidence_recall"], 4),
                      _f(p["head"]["evidence_recall"], 4), _f(p["hybrid"]["evidence_recall"], 4),
                      _f(p["default"]["multi_hop_hit"]), _f(p["head"]["multi_hop_hit"]), _f(p["hybrid"]["multi_hop_hit"])])
    print("\nLOCO, B = 16 (macro evidence recall | multi-hop all-evidence hit)")
    print(_md(["held out", "n", "default", "head", "hybrid", "mh default", "mh head", "mh hybrid"], fold_rows))
    print("\nTable (dev, MiniLM)")
    print(_md(["method", "B", "evidence recall", "all-evidence hit", "multi-hop hit", "tokens"],
              [[r["method"], r["budget"], _f(r["evidence_recall"]), _f(r["all_evidence_hit"]), _f(r["multi_hop_hit"]),
                _f(r["context_tokens"], 0)] for r in tres["rows"]]))
    s = tres["heads"][LOCO_B]["summary"]
    print("\nall-dev B=16 head, weights at x=(1,0,0,0): "
          + ", ".join(f"{k} {s['weights0'][k]:.3g}->{v:.3g}" for k, v in s["weights"].items()))
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
