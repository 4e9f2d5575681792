"""Shared by the analyses: cluster-bootstrap intervals, figures and their files, and the
per-question rows of one configuration."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import harness
from .paper import CAT_NAMES, CATS


def ci(values, clusters):
    """Mean with a 95% interval from 2,000 bootstrap resamples of whole clusters (conversations)."""
    from trawmem_gpu.eval.analyses import cluster_bootstrap

    est, lo, hi = cluster_bootstrap(values, clusters, n_boot=2000, seed=0)
    return {"mean": est, "ci95": [lo, hi]}


def ci_median(values, clusters):
    """Median with a 95% interval, resampled as :func:`ci`."""
    from trawmem_gpu.eval.analyses import cluster_bootstrap

    est, lo, hi = cluster_bootstrap(values, clusters, stat=np.median, n_boot=2000, seed=0)
    return {"median": est, "ci95": [lo, hi]}


def grid_figure(rows: int, cols: int, width: float, row_height: float):
    """``(fig, axes [rows, cols])`` on the Agg backend."""
    return harness.figure(rows, cols, figsize=(width, row_height * rows), squeeze=False)


def save_figure(fig, out: Path, name: str, title: str, res: dict) -> None:
    """``res`` as ``NAME.json`` and ``fig`` (titled) as ``NAME.png`` under ``out``."""
    fig.suptitle(title)
    fig.tight_layout()
    harness.save(name, res, fig, out_dir=out)


def box_by_category(ax, data: list[list[float]], mean_label: str) -> None:
    """Paper-style boxes per category: black medians, orange means, hollow outliers."""
    ax.boxplot(data, tick_labels=[CAT_NAMES[c] for c in CATS], medianprops={"color": "k"},
               flierprops={"marker": "o", "markerfacecolor": "none", "markersize": 3})
    ax.scatter(np.arange(1, len(data) + 1), [np.mean(d) for d in data], color="orange", zorder=5, label=mean_label)


def query_rows(runner, items, banks, enc_s) -> list[dict]:
    """Per question (no text): counts, ratio, threads, tokens, time, for one configuration."""
    from trawmem_gpu.eval.analyses import reduction_ratio, thread_usage

    rows = []
    for (bid, q), rec, sel, e in zip(items, runner.records, runner.selections, enc_s):
        n_thr, upt = thread_usage(sel.units, banks[bid].unit_thread)
        rows.append({"qid": q.qid, "bank_id": bid, "category": q.category, "n_candidates": int(len(sel.candidates)),
                     "n_selected": len(sel.units), "c_q": reduction_ratio(len(sel.units), len(sel.candidates)),
                     "n_threads": n_thr, "units_per_thread": upt, "context_tokens": rec["context_tokens"],
                     "time_s": float(e) + rec["latency_s"], "select_s": rec["select_s"],
                     "evidence_recall": rec["evidence_recall"]})
    return rows
