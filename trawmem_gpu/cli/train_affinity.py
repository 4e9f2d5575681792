"""``trawmem train-affinity``: fit the learned affinity (``--affinity-weights``) from gold evidence labels."""
from __future__ import annotations


def cmd_train_affinity(a) -> int:
    import time

    from ..errors import InputError
    from ..paths import file_sha256
    from ..head.relevance import NEEDS_LABELS, fit_relevance, load_labelled, save_weights

    t0 = time.perf_counter()
    qs, meta = [], []
    for path in a.data:
        got, _ = load_labelled(path, progress=not a.quiet, dayfirst=a.dayfirst, folds=1)
        if not got:
            raise InputError(f"{path}: no labelled question to fit the affinity on ({NEEDS_LABELS})")
        qs += got
        meta.append({"path": str(path), "sha256": file_sha256(path), "questions": len(got),
                     "gold_units": int(sum(q.y.sum() for q in got))})
    w = fit_relevance(qs, C=a.C)
    out = save_weights(a.out, w, {"data": meta, "C": a.C, "seconds": round(time.perf_counter() - t0, 1)})
    print(f"fitted the learned affinity on {len(qs)} questions of {len(a.data)} data set"
          f"{'s' if len(a.data) != 1 else ''} in {time.perf_counter() - t0:.1f}s -> {out}")
    print("use it with --affinity-weights " + str(out))
    return 0


def configure(f) -> None:
    from .args import MAX_C, add_dayfirst, float_range

    f.describe("Fit the learned affinity (SelectConfig.relevance_weights: a logistic model over the relevance "
               "features) on the gold evidence of one or more labelled benchmark files, and write the weights "
               "as JSON for --affinity-weights.")
    f.add_argument("--data", required=True, action="append",
                   help="labelled benchmark file (LoCoMo layout or LongMemEval); repeat it to fit on several, each "
                        "data set weighing the same")
    f.add_argument("--out", required=True, help="weights file to write (JSON); pass it to --affinity-weights")
    f.add_argument("--C", type=float_range(0.0, MAX_C), default=1.0,
                   help=f"inverse L2 strength of the logistic fit: above 0, at most {MAX_C:g}")
    add_dayfirst(f)
    f.add_argument("--quiet", action="store_true", help="no progress bars")
    f.set_defaults(fn=cmd_train_affinity)
