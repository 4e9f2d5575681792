"""``trawmem train-head``: fit the learned role head from gold evidence labels."""
from __future__ import annotations

import json


def cmd_train_head(a) -> int:
    from ..data import check_input_file, require_locomo
    from ..head.train import train_head

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


def configure(t) -> None:
    from .args import MAX_BUDGET, add_dayfirst, budget_int, int_range, nonneg_float, nonneg_int, positive_float
    from ..head.defaults import DEFAULTS

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
