"""Optional learned role head: x_q -> A, M(delta) and the objective/cost weights (see ``model``).

The names below are loaded on first use (PEP 562), so importing a light submodule
(``head.defaults``) does not import torch.
"""
from __future__ import annotations

_LAZY = {"HeadError": "model", "LEARNED_WEIGHTS": "model", "RoleHead": "model", "load_head": "model",
         "save_head": "model", "train_head": "train"}
__all__ = ["HeadError", "LEARNED_WEIGHTS", "RoleHead", "load_head", "save_head", "train_head"]


def __getattr__(name: str):
    """The lazily exported names: ``model``'s, and ``train.train_head`` (it pulls in tqdm and the encoder)."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
