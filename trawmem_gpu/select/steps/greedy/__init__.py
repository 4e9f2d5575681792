"""Stage 2, step 7 (design note): maximize J greedily. The objective lives in ``objective.py``
(apricot style): its terms own their gains and state updates; the optimizers here get J's data and
weights, call the terms and own only the order of evaluation.

* ``rule.py``: the budget / stop rule and the token knapsack (:class:`StopRule`,
  :class:`TokenBudget`, the cost-aware greedy's :func:`best_of_two`), one statement each;
* ``reference.py``: NumPy per query (:func:`plain_greedy`, :func:`lazy_greedy`): the reference;
* ``batched.py``: torch over a padded batch (:func:`greedy_select_torch`, plain, one full sweep per
  step; :func:`greedy_lazy_torch`, lazy), composed from the terms' torch methods, and the Triton
  plain kernel (``kernels/greedy.py``) behind :func:`greedy_select`;
* ``compiled.py``: the per-query lazy greedy in numba (:func:`lazy_greedy_one`), with the pieces of
  the coverage terms that declare ``numba`` in ``terms.TERMS`` fused inline (``FUSED_TERMS``).

All pick exactly what plain greedy picks, ties to the lowest candidate index; the float32 paths
(torch float32, Triton) may break a near-tie (gains within float32 rounding) differently.
"""
from .batched import GreedyProblem, greedy_lazy_torch, greedy_select, greedy_select_torch
from .compiled import FUSED_TERMS, CompiledQuery, GreedyScratch, KSource, best_of_two_compiled, greedy_scratch, \
    lazy_greedy_one, sift_down
from .reference import cost_aware_greedy, greedy_reference_np, lazy_greedy, plain_greedy
from .rule import StopRule, TokenBudget, best_of_two, config_rule, coverage_reached, coverage_reached_compiled, \
    greedy_key, greedy_key_compiled, j_value, marginal_cost, marginal_cost_compiled, pick_limit

__all__ = ["GreedyProblem", "greedy_lazy_torch", "greedy_select", "greedy_select_torch", "FUSED_TERMS",
           "CompiledQuery", "GreedyScratch", "KSource", "best_of_two_compiled", "greedy_scratch", "lazy_greedy_one",
           "sift_down", "cost_aware_greedy", "greedy_reference_np", "lazy_greedy", "plain_greedy", "StopRule",
           "TokenBudget", "best_of_two", "config_rule", "coverage_reached", "coverage_reached_compiled",
           "greedy_key", "greedy_key_compiled", "j_value", "marginal_cost", "marginal_cost_compiled", "pick_limit"]
