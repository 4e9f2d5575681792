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


def load_weights(path: str | Path, features) -> tuple[float, ...]:
    """The relevance weights of a file written by :func:`save_weights` (``affinity_weights``);
    clear errors for a missing or foreign file, or one fitted for other ``features`` than these."""
    from ..errors import InputError, read_json

    path = Path(path)
    doc = read_json(path, f"affinity_weights {path}", "not a weights file")
    if not isinstance(doc, dict) or doc.get("format") != WEIGHTS_FORMAT:
        raise InputError(f"affinity_weights {path}: not a weights file (write one with `trawmem train-affinity`)")
    if doc.get("features") != list(features):
        raise InputError(f"affinity_weights {path}: fitted for the features {doc.get('features')}, this version "
                         f"uses {list(features)}; fit it again with `trawmem train-affinity`")
    w = doc.get("weights")
    if not isinstance(w, list) or len(w) != len(features) + 1 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in w):
        raise InputError(f"affinity_weights {path}: 'weights' must be {len(features) + 1} finite numbers")
    return tuple(float(x) for x in w)
