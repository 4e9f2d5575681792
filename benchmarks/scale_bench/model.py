"""Where the time goes: each measured part fitted as ``t(N) = a + b N`` over the bank sizes.

A part whose time does not grow with the bank has ``b`` near 0 (its cost is the append's own: the
turn, the session it joins); one that grows has ``b`` > 0 and dominates at large ``N``. The fit
is least squares on the medians; ``share_at`` gives each part's share of the total at a size.
"""
from __future__ import annotations


def fit(xs: list[float], ys: list[float]) -> dict:
    """``{"a_ms", "b_ms_per_1k_units", "r2"}`` of ``y = a + b x`` (seconds in, milliseconds out)."""
    import numpy as np

    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return {"a_ms": round(float(y.mean()) * 1e3, 3) if len(y) else None, "b_ms_per_1k_units": None, "r2": None}
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"a_ms": round(float(a) * 1e3, 3), "b_ms_per_1k_units": round(float(b) * 1e6, 4), "r2": round(r2, 3)}


def where_time_goes(rows: list[dict], section: str, parts: list[str]) -> dict:
    """The fit of every part of ``rows[i][section]`` (and its total) against ``n_units``."""
    ok = [r for r in rows if section in r]
    xs = [r["n_units"] for r in ok]
    out = {p: fit(xs, [r[section][p] for r in ok]) for p in parts + ["total_s"] if ok and p in ok[0][section]}
    if ok:
        big = max(ok, key=lambda r: r["n_units"])
        tot = big[section]["total_s"] or 1.0
        out["share_at_largest"] = {"n_units": big["n_units"],
                                   **{p: round(big[section][p] / tot, 3) for p in parts if p in big[section]}}
    return out


def ratios(rows: list[dict], section: str, base: int, targets: dict[int, float]) -> dict:
    """``t(N) / t(base)`` of ``section``'s total for each size ``N`` of ``targets`` (with its bound)."""
    by = {r["n_units"]: r for r in rows if section in r}
    out = {}
    if base not in by:
        return out
    t0 = by[base][section]["total_s"]
    for n, bound in targets.items():
        near = min(by, key=lambda m: abs(m - n)) if by else None
        if near is not None and abs(near - n) <= 0.05 * n:
            r = by[near][section]["total_s"] / t0
            out[str(near)] = {"ratio": round(r, 3), "bound": bound, "met": r <= bound}
    return out
