"""The learned role head's training defaults, importable without torch (``trawmem train-head --help``
shows them)."""

DEFAULTS = {"epochs": 20, "lr": 0.05, "seed": 0, "l2": 1e-3, "temp": 1.0, "steps": None, "loss_kind": "listwise"}
"""Training defaults, chosen on three two-conversation dev folds (listwise loss over the full
greedy unroll; ``steps=None`` = B); the fold measurements behind each value are in
benchmarks/results/quality.md ("Learned role head")."""


from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class FitOptions:
    """The training hyperparameters of a role head (``head.train.fit``, ``train_head``); the
    defaults are :data:`DEFAULTS`."""

    epochs: int = DEFAULTS["epochs"]
    """Passes over the training questions."""
    lr: float = DEFAULTS["lr"]
    """Adam learning rate."""
    seed: int = DEFAULTS["seed"]
    """Seed of the initialisation and the minibatch shuffling."""
    l2: float = DEFAULTS["l2"]
    """Weight of the head's L2 penalty."""
    temp: float = DEFAULTS["temp"]
    """Softmax temperature of the unrolled greedy choices."""
    steps: int | None = DEFAULTS["steps"]
    """Greedy steps unrolled per question (None: the pool budget B)."""
    loss_kind: str = DEFAULTS["loss_kind"]
    """The loss over the unroll (``listwise``, ...; ``head.train.greedy_unroll``)."""
