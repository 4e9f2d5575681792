"""Scores of the transfer table: per-question records over a set's units, their summary, paired
intervals (the bootstrap of ``equal_tokens_bench.stats``), and the picks cache."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ..equal_tokens_bench.stats import margin_bootstrap, records, summary


def scored(ds, picks: list[list[int]], headings: str) -> dict:
    """``{"records": [...], "summary": {...}}`` of ``picks`` over ``ds``'s units, rendered with
    ``headings`` (evidence recall over messages: a burst shows all its members)."""
    recs = records(ds, (picks, headings))
    return {"records": recs, "summary": summary(ds, recs)}


def paired(ds, ours: list[dict], theirs: list[dict]) -> dict:
    """Macro recall of ``ours`` minus ``theirs`` (paired, category-stratified bootstrap, 95%), and
    the same for LoCoMo's multi-hop all-evidence hit (a plain paired bootstrap over its questions)."""
    m = margin_bootstrap(ds, ours, theirs, n_boot=4000)
    out = {"margin": m["margin"], "ci95": m["ci95"], "better_worse_equal": m["questions_better_worse_equal"]}
    mh = [(a["hit"], b["hit"]) for a, b in zip(ours, theirs) if a["cat"] == 1]
    if ds.name == "locomo" and mh:
        d = np.array([a - b for a, b in mh])
        rng = np.random.default_rng(0)
        boot = d[rng.integers(0, len(d), size=(4000, len(d)))].mean(axis=1)
        out["multi_hop"] = {"diff": float(d.mean()), "ci95": [float(x) for x in np.percentile(boot, [2.5, 97.5])]}
    return out


class PickCache:
    """Picks by key on disk (``TRAWMEM_CACHE/bench_transfer/TAG.json``), so a rerun that adds a
    variant selects only what is new. Keys hold everything the picks depend on that the run can
    name: the variant, its weights' bytes, the set and its view spec, T; ``tag`` (``--cache``)
    names the source tree the picks came from (a changed tree needs a new tag)."""

    def __init__(self, tag: str | None):
        from trawmem_gpu.paths import default_cache_dir

        self.path = None if not tag else default_cache_dir() / "bench_transfer" / f"{tag}.json"
        self.data: dict = {}
        if self.path is not None and self.path.exists():
            self.data = json.loads(self.path.read_text())

    @staticmethod
    def key(*parts) -> str:
        h = hashlib.sha256()
        for p in parts:
            h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode())
            h.update(b"\0")
        return h.hexdigest()[:24]

    def get(self, key: str, make):
        """The value kept under ``key``, else ``make()``'s (JSON: picks as lists of ints, weights as
        lists of floats), kept."""
        if key not in self.data and self.path is not None and self.path.exists():
            self.data = {**json.loads(self.path.read_text()), **self.data}  # another run may have made it
        if key not in self.data:
            self.data[key] = json.loads(json.dumps(make(), default=lambda o: o.tolist()))
            self.save()
        return self.data[key]

    def save(self) -> None:
        """Merge into the file under its lock (runs of other variants may share the tag)."""
        if self.path is None:
            return
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            if self.path.exists():
                self.data = {**json.loads(self.path.read_text()), **self.data}
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)


def pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def iv(m: dict, key: str = "margin") -> str:
    """``+1.2 [-0.3, +2.8]`` in points."""
    return f"{pct(m[key])} [{pct(m['ci95'][0])}, {pct(m['ci95'][1])}]"
