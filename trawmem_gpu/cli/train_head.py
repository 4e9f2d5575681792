"""``trawmem train-head``: fit the learned role head from gold evidence labels."""
from __future__ import annotations

import json


def cmd_train_head(a) -> int:
    from ..data import check_input_file, require_locomo
    from .train import train_head

    require_locomo(check_input_file(a.data), "train-head")
    convs = [c for c in a.conversations.split(",") if c.strip()] if a.conversations else None
    res = train_head(a.data, a.out, conversations=convs, epochs=a.epochs, lr=a.lr, seed=a.seed, budget=a.budget,
                     steps=a.steps, l2=a.l2, temp=a.temp, progress=not a.quiet, dayfirst=a.dayfirst)
    h = res["history"]
    print(f"trained role head on {h['n_used']} of {h['n_questions']} questions (gold in U_q) "
          f"in {h['seconds']:.1f}s; loss {h['epoch_loss'][0]:.4f} -> {h['epoch_loss'][-1]:.4f}")
    print(f"wrote {res['out']} (sha256 {res['head_sha256'][:16]}), loss curve {res['loss_png']}")
    w = res["summary"]["weights"]
    w0 = res["summary"]["weights0"]
    print("weights at x=(1,0,0,0): " + ", ".join(f"{k} {w0[k]:.3g}->{w[k]:.3g}" for k in w))
    if a.json:
        print(json.dumps({k: v for k, v in res.items() if k != "history"} | {"history": {
            k: h[k] for k in ("epoch_loss", "n_questions", "n_used", "seconds", "hyper")}}, indent=1))
    return 0


def cmd_train_affinity(a) -> int:
    import time

    from ..errors import InputError
    from ..paths import file_sha256
    from .relevance import NEEDS_LABELS, fit_relevance, load_labelled, save_weights

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


def configure_train_head(t) -> None:
    from ..cli_args import MAX_BUDGET, add_dayfirst, budget_int, int_range, nonneg_float, nonneg_int, positive_float
    from .train import DEFAULTS

    t.describe("Train the learned role head (the role affinity A, the role-feature matrix M(delta) and the "
               "objective weights) on the gold evidence of LoCoMo-layout data, unrolling the greedy selection "
               "in a listwise loss. Writes the head (safetensors) and its loss curve (PNG).")
    t.add_argument("--data", required=True, help="LoCoMo-layout JSON with evidence labels")
    t.add_argument("--out", required=True, help="head file to write (safetensors); the loss curve goes beside it")
    t.add_argument("--conversations", help="comma-separated bank ids to train on (default: all)")
    add_dayfirst(t)
    t.add_argument("--epochs", type=int_range(1, 100_000), default=DEFAULTS["epochs"],
                   help="passes over the training questions")
    t.add_argument("--lr", type=positive_float, default=DEFAULTS["lr"], help="Adam learning rate (above 0)")
    t.add_argument("--seed", type=nonneg_int, default=DEFAULTS["seed"], help="seed of the initialisation and shuffling")
    t.add_argument("--budget", type=budget_int, default=16, help="B the head is trained for")
    t.add_argument("--steps", type=int_range(1, MAX_BUDGET), default=DEFAULTS["steps"],
                   help="greedy steps unrolled in the loss (default: the budget)")
    t.add_argument("--l2", type=nonneg_float, default=DEFAULTS["l2"], help="L2 pull towards the hand-set start")
    t.add_argument("--temp", type=positive_float, default=DEFAULTS["temp"], help="listwise softmax temperature")
    t.add_argument("--json", action="store_true", help="also print the result summary as JSON")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(fn=cmd_train_head)


def configure_train_affinity(f) -> None:
    from ..cli_args import MAX_C, add_dayfirst, float_range

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
