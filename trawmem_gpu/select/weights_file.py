"""The ``learned`` affinity's weights file: one weight per ``config.features`` entry,
then the bias, with the feature list and provenance. ``trawmem train-affinity`` writes one; the
shipped default (``SelectConfig.relevance_weights``) is the package's ``affinity_weights.json``,
read once at import (``benchmarks/bench_equal_tokens.py --parts fit`` writes it)."""
from __future__ import annotations

import math
from pathlib import Path


WEIGHTS_FORMAT = "trawmem-affinity-weights"


def save_weights(path: str | Path, weights, features, meta: dict | None = None) -> Path:
    """Write ``weights`` (one per entry of ``features``, then the bias) as JSON with the feature
    list and ``meta`` (provenance), atomically."""
    import json
    import os

    path = Path(path)
    doc = {"format": WEIGHTS_FORMAT, "features": list(features), "weights": [float(x) for x in weights],
           **({"meta": meta} if meta else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_weights(path: str | Path, features, label: str = "`affinity_weights`") -> tuple[float, ...]:
    """The relevance weights of a file written by :func:`save_weights` (``affinity_weights``);
    clear errors for a missing or foreign file, or one fitted for other ``features`` than these. A
    file fitted on the first features of ``features`` only (an earlier version's, before a feature
    was added) is read with weight 0 for the others: the affinity it was fitted as."""
    from ..errors import InputError, read_json

    path = Path(path)
    doc = read_json(path, f"{label} {path}", "not a weights file")
    if not isinstance(doc, dict) or doc.get("format") != WEIGHTS_FORMAT:
        raise InputError(f"{label} {path}: not a weights file (write one with `trawmem train-affinity`)")
    have = doc.get("features")
    if not isinstance(have, list) or have != list(features)[:len(have)] or not have:
        raise InputError(f"{label} {path}: fitted for the features {have}, this version "
                         f"uses {list(features)}; fit it again with `trawmem train-affinity`")
    w = doc.get("weights")
    if not isinstance(w, list) or len(w) != len(have) + 1 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in w):
        raise InputError(f"{label} {path}: 'weights' must be {len(features) + 1} finite numbers")
    if not any(w[:-1]):
        raise InputError(f"{label} {path}: every feature weight is 0, so the affinity carries no signal "
                         "(a fit with C = 0?); fit it again with `trawmem train-affinity`")
    meta = doc.get("meta")
    C = meta.get("C") if isinstance(meta, dict) else None
    if C is not None and not (isinstance(C, (int, float)) and not isinstance(C, bool) and math.isfinite(C) and C > 0):
        raise InputError(f"{label} {path}: fitted with C = {C!r}, outside C > 0 (the fit is not a "
                         "regularized one); fit it again with `trawmem train-affinity --C` above 0")
    # a file of an earlier version, fitted on the first features only: the later ones get weight 0,
    # so the affinity is the one it was fitted as
    return tuple(float(x) for x in w[:-1]) + (0.0,) * (len(features) - len(have)) + (float(w[-1]),)
