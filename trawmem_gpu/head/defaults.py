"""The learned role head's training defaults, importable without torch (``trawmem train-head --help``
shows them)."""

DEFAULTS = {"epochs": 20, "lr": 0.05, "seed": 0, "l2": 1e-3, "temp": 1.0, "steps": None, "loss_kind": "listwise"}
"""Training defaults, chosen on three two-conversation dev folds (listwise loss over the full
greedy unroll; ``steps=None`` = B); the fold measurements behind each value are in
benchmarks/results/quality.md ("Learned role head")."""
