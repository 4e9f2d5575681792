"""Mixes of per-query parameters (budgets, hops, token budgets) the selection tests run."""
from __future__ import annotations

from trawmem_gpu.select.params import QueryParams


MIX = [QueryParams(budget=4, hops=0), QueryParams(budget=16, hops=1), QueryParams(budget=7, hops=3),
       QueryParams(budget=None, token_budget=120), QueryParams(budget=3, token_budget=400, hops=2),
       QueryParams(budget=2), QueryParams(token_budget=60, hops=0), QueryParams(budget=50, hops=2, n_seeds=1)]

VARIANTS = ({"backend": "compiled"}, {"backend": "compiled", "front": "tensor"},
            {"backend": "tensor", "optimizer": "lazy"}, {"backend": "tensor", "optimizer": "plain"})
