"""One run of the transfer table: the sets, the hybrid's picks, the fits and every candidate's
picks (kept in the bench cache with ``--cache``), and the tables built from them."""
from __future__ import annotations

import time

import numpy as np

from .score import PickCache, paired, scored
from .sets import SOURCES, load_set, sample_banks
from .variants import VARIANTS, fit_both, fit_weights, select_hybrid, select_variant


class Run:
    """The sets of ``paths`` (source -> dev file) under ``views``, scored at ``Ts``."""

    def __init__(self, paths: dict, views: list[str], Ts: list[int], cache_tag: str | None,
                 lme_view_banks: int | None = None, sources: tuple = SOURCES, lme_views: list[str] | None = None):
        from trawmem_gpu.data.chat_views import view_spec

        from .unit_vecs import forms

        if "plain" not in views:
            views = ["plain"] + views  # the fits read the plain sets
        self.views, self.Ts, self.sources = views, Ts, tuple(sources)
        only = {s: None for s in SOURCES}
        if lme_view_banks:
            only["longmemeval"] = sample_banks(paths["longmemeval"], lme_view_banks)
        per = {s: views for s in self.sources}
        if lme_views is not None and "longmemeval" in per:
            per["longmemeval"] = ["plain"] + [v for v in lme_views if v != "plain"]
        self.sets = {(s, v): load_set(s, paths[s], v, None if v == "plain" else only[s])
                     for s in self.sources for v in per[s]}
        self.vecs = forms()  # the experiment switch (``unit_vecs``): {} as shipped
        self.spec = {k: view_spec(k[1]).to_dict() | ({"unit_vecs": self.vecs[k[1]]} if k[1] in self.vecs else {})
                     for k in self.sets}
        if "longmemeval" in self.sources and only["longmemeval"] is not None and len(per["longmemeval"]) > 1:
            key = ("longmemeval", "plain-sample")
            self.sets[key] = self.sets[("longmemeval", "plain")].subset(only["longmemeval"], "plain-sample")
            self.spec[key] = view_spec("plain").to_dict() | {"sample": sorted(only["longmemeval"])}
        self.cache = PickCache(cache_tag)
        self._W: dict = {}
        self._scores: dict = {}
        self.base_units: dict = {}

    # -- the hybrid ---------------------------------------------------------------------------
    def hybrid(self, key, units: str, T: int) -> dict:
        k = ("hybrid", key, units, T)
        if k not in self._scores:
            ds = self.sets[key]
            picks = self.cache.get(PickCache.key("hybrid", self.spec[key], key, units, T),
                                   lambda: select_hybrid(ds, units, T))
            self._scores[k] = scored(ds.units(units), picks, "none")
        return self._scores[k]

    def hybrid_table(self) -> dict:
        """Per set: the hybrid's macro metrics over bursts and over messages at each T, and the
        units it runs on in the margins (the stronger, by mean macro recall over the T's)."""
        out = {}
        for key, ds in self.sets.items():
            kinds = ("bursts", "messages") if ds.has_bursts else ("bursts",)
            rows = {u: {T: self.hybrid(key, u, T)["summary"]["macro"] for T in self.Ts} for u in kinds}
            best = max(kinds, key=lambda u: (np.mean([rows[u][T]["recall"] for T in self.Ts]), u == "bursts"))
            self.base_units[key] = best
            out[ds.label] = {"by_units": {u: {str(T): m for T, m in r.items()} for u, r in rows.items()},
                             "baseline_units": best}
            print(f"hybrid {ds.label}: " + "; ".join(f"{u} " + " ".join(f"T={T} {r[T]['recall']:.3f}" for T in self.Ts)
                                                   for u, r in rows.items()) + f" -> {best}", flush=True)
        return out

    def baseline(self, key, T: int) -> dict:
        return self.hybrid(key, self.base_units[key], T)

    # -- fits and candidates ------------------------------------------------------------------
    def weights(self, features: tuple, regime: str) -> dict:
        """The weights for ``features`` (``Variant.features``) under ``regime`` (the sources' fits, or
        ``both``: today's folds)."""
        regs = ("both",) if regime == "both" else self.sources
        for reg in regs:
            if (features, reg) in self._W:
                continue
            t0 = time.perf_counter()
            make = (lambda: fit_both(self.sets, features)) if reg == "both" else \
                (lambda: fit_weights(self.sets, features, reg))
            raw = self.cache.get(PickCache.key("fit", features, reg, *([self.vecs] if self.vecs else [])),
                                 lambda: [[list(k), list(map(float, w))] for k, w in make().items()])
            self._W[(features, reg)] = {tuple(k): np.asarray(w) for k, w in raw}
            print(f"fits {features} {reg}: {len(raw)} ({time.perf_counter() - t0:.0f}s)", flush=True)
        return {k: w for reg in regs for k, w in self._W[(features, reg)].items()}

    def trawmem(self, key, vname: str, fit: str, T: int) -> dict:
        k = (vname, key, fit, T)
        if k not in self._scores:
            v, ds = VARIANTS[vname], self.sets[key]
            W = self.weights(v.features, fit)
            ws = sorted((str(g), w.tobytes().hex()) for g, w in W.items())
            t0 = time.perf_counter()
            picks = self.cache.get(PickCache.key("trawmem", v.features, v.config, v.bursts, ws, fit, self.spec[key], key,
                                                 T),
                                   lambda: select_variant(ds, v, W, fit, T))
            self._scores[k] = scored(ds.units("bursts" if v.bursts else "messages"), picks, "date")
            m = self._scores[k]["summary"]["macro"]
            print(f"{vname} fit={fit} {ds.label} T={T}: {m['recall']:.3f} mh={m['multi_hop_hit']} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
        return self._scores[k]

    def column(self, key, vname: str, fit: str, T: int) -> dict:
        """One cell of a table: the candidate's macro metrics, the hybrid's, and the paired margin."""
        ds = self.sets[key]
        ours, base = self.trawmem(key, vname, fit, T), self.baseline(key, T)
        mo, mb = ours["summary"]["macro"], base["summary"]["macro"]
        return {"variant": vname, "fit": fit, "set": ds.label, "T": T, "recall": mo["recall"], "hit": mo["hit"],
                "tokens": mo["tokens"], "multi_hop_hit": mo["multi_hop_hit"], "hybrid_recall": mb["recall"],
                "hybrid_multi_hop_hit": mb["multi_hop_hit"], "hybrid_units": self.base_units[key],
                "vs_hybrid": paired(ds, ours["records"], base["records"])}

    # -- tables -------------------------------------------------------------------------------
    def views_table(self) -> list[dict]:
        """The shipped defaults on every set, weights by today's protocol (each fold fitted on the
        other folds of both plain sources)."""
        return [self.column(key, "defaults", "both", T) for key in self.sets for T in self.Ts]

    def transfer_table(self, names: list[str]) -> list[dict]:
        """Every candidate in every column (fit source x set x T), with its paired difference from
        the defaults in the same column."""
        rows = []
        for vname in names:  # the defaults' picks are made when a column first needs them
            for fit in self.sources:
                for key in self.sets:
                    for T in self.Ts:
                        row = self.column(key, vname, fit, T)
                        if vname != "defaults":
                            ds = self.sets[key]
                            row["vs_defaults"] = paired(ds, self.trawmem(key, vname, fit, T)["records"],
                                                        self.trawmem(key, "defaults", fit, T)["records"])
                        rows.append(row)
        return rows

    def set_stats(self) -> dict:
        return {ds.label: ds.stats() | {"has_bursts": ds.has_bursts, "view": self.spec[k]} for k, ds in self.sets.items()}

    @staticmethod
    def verdicts(rows: list[dict]) -> dict:
        """Per candidate: the columns it loses (interval of its difference from the defaults wholly
        below 0, in macro recall or multi-hop hit) and gains, and whether it survives."""
        out: dict = {}
        for r in rows:
            d = r.get("vs_defaults")
            if d is None:
                continue
            v = out.setdefault(r["variant"], {"loses": [], "gains": [], "columns": 0})
            v["columns"] += 1
            col = f"{r['fit']}->{r['set']}@{r['T']}"
            if d["ci95"][1] < 0 or ("multi_hop" in d and d["multi_hop"]["ci95"][1] < 0):
                v["loses"].append(col)
            if d["ci95"][0] > 0:
                v["gains"].append(col)
        for v in out.values():
            v["survives"] = not v["loses"]
        return out
