"""Per-query parameters: what each query asks for, apart from the method (``SelectConfig``).

A :class:`QueryParams` travels with every query (faiss style: search parameters per call), so one
:class:`~trawmem_gpu.select.engine.SelectionEngine` (one set of bank tables) answers any mix of
budgets B, hops H and token budgets T, per call or per query within one batch. Nothing here is
read when the bank tables are built.

Every front (the command line, ``Memory``, HTTP, MCP, ``score``) builds a query's params by one
rule, :func:`merge_params`: the request's fields over the collection's defaults over the
method's, held to the front's :class:`QueryLimits` (the engine's: :data:`ENGINE_LIMITS`; the
server's: :data:`SERVED_LIMITS`).

The sizes the method derives from the budget (the candidate pool: ``n_seeds``,
``neighborhood_cap``; the priority cap kappa = 1 / B_q) are resolved per query by
:meth:`QueryParams.resolved`, the one home of those rules. Errors name the field
(```token_budget` must lie in ...``, in backquotes); each front words them in its own terms (the
command line maps fields to its flags, HTTP names the body field).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from types import SimpleNamespace
from typing import Literal, Mapping, Sequence

from ..data.types import MAX_QUESTION_CHARS
from ..dictconfig import DictFields
from ..errors import ConfigError

TOKENS_PER_UNIT = 50
"""Workspace tokens one selected unit is taken to cost when a token budget T sizes what a unit
budget B sizes (the candidate pool, the priority cap): B_T = max(1, round(T / TOKENS_PER_UNIT)),
so T = 800 sizes the pool like B = 16 (about what one selected unit costs with its heading)."""
FILLS = ("skip", "stop")


def _whole(name: str, val, low: int, high: int, none_ok: bool = False):
    if val is None:
        if none_ok:
            return None
        raise ConfigError(f"`{name}` must be a whole number (got None)")
    if isinstance(val, bool) or not isinstance(val, numbers.Integral):
        raise ConfigError(f"`{name}` must be a whole number (got {val!r})")
    if not low <= val <= high:
        raise ConfigError(f"`{name}` must lie in [{low}, {high}] (got {val!r})")
    return int(val)


@dataclass(frozen=True)
class QueryLimits:
    """The bounds a query is held to, one field per bound (the engine's own: :data:`ENGINE_LIMITS`;
    ``trawmem serve`` and ``trawmem mcp``: :data:`SERVED_LIMITS`, or ``--max-budget`` ...).

    A front passes its limits to :func:`merge_params`; a value past them is a
    :class:`LimitError` naming the field and the limit, which the front words in its own terms.
    A limit may tighten the engine's, never loosen it."""

    max_budget: int = 4096
    """Most units a query may ask for (``budget``, B). Every buffer is sized by the candidate pool,
    never by B itself: the bound keeps a request's size stated and its numbers small."""
    max_hops: int = 8
    """Most propagation hops a query may ask for (``hops``, H). Propagation keeps the max over
    paths, so past the graph's diameter more hops change nothing; the bound caps one query's work."""
    max_token_budget: int = 1_000_000
    """Most workspace tokens a query may ask for (``token_budget``, T)."""
    max_question_chars: int = MAX_QUESTION_CHARS
    """Longest question, in characters (``data.types.MAX_QUESTION_CHARS`` for the engine)."""

    BOUNDS = (("budget", "max_budget", 1), ("hops", "max_hops", 0), ("token_budget", "max_token_budget", 1))
    """``(QueryParams field, limit field, least value)`` of each bounded query field."""

    def __post_init__(self):
        top = {f.name: f.default for f in fields(QueryLimits)}
        for _, limit, low in self.BOUNDS:
            _whole(limit, getattr(self, limit), low, top[limit])
        _whole("max_question_chars", self.max_question_chars, 1, 1 << 30)

    def check(self, given: dict) -> None:
        """Raise :class:`LimitError` for the first whole-number value of ``given`` (query fields)
        outside these limits (a value of another type is left to :class:`QueryParams`)."""
        for name, limit, low in self.BOUNDS:
            v = given.get(name)
            if isinstance(v, numbers.Integral) and not isinstance(v, bool) and not low <= v <= getattr(self, limit):
                raise LimitError(name, low, getattr(self, limit), v, limit)


class LimitError(ConfigError):
    """A query field outside a front's :class:`QueryLimits`: ``field`` (the ``QueryParams`` field),
    its range ``low`` .. ``high``, the value ``got`` and ``limit`` (the ``QueryLimits`` field)."""

    def __init__(self, field: str, low: int, high: int, got, limit: str):
        self.field, self.low, self.high, self.got, self.limit = field, low, high, got, limit
        super().__init__(f"`{field}` must lie in [{low}, {high}] (got {got!r}; the limit `{limit}`)")


ENGINE_LIMITS = QueryLimits()
"""The engine's bounds: every :class:`QueryParams` is held to them."""
SERVED_LIMITS = QueryLimits(max_budget=64, max_hops=3, max_token_budget=16_384)
"""What ``trawmem serve`` (``ServeConfig.limits``; ``--max-budget``, ``--max-hops``,
``--max-token-budget``) and ``trawmem mcp`` hold a request to."""
MAX_BUDGET = ENGINE_LIMITS.max_budget
"""``ENGINE_LIMITS.max_budget``."""
MAX_HOPS = ENGINE_LIMITS.max_hops
"""``ENGINE_LIMITS.max_hops``."""
MAX_TOKEN_BUDGET = ENGINE_LIMITS.max_token_budget
"""``ENGINE_LIMITS.max_token_budget``."""


@dataclass(frozen=True)
class QueryParams(DictFields):
    """What one query asks for: its budgets, hops and how a ranked baseline fills T."""

    budget: int | None = 16
    """B: at most this many units in the workspace (B_q = max(1, min(B, |U_q|))). With a
    ``token_budget`` an optional cap on the number of units (None = no cap) that no longer sizes
    anything (see :attr:`pool_budget`)."""
    token_budget: int | None = None
    """T: the rendered workspace (headings included, ``cl100k_base``) holds at most T tokens;
    None = no token budget (B alone). TrawMem then maximizes J under a knapsack on the units'
    token costs; the baselines take ranked units while they fit (:attr:`fill`)."""
    hops: int = 1
    """H: propagation hops over the thread graph (0 = seeds only), at most :data:`MAX_HOPS`."""
    fill: Literal["skip", "stop"] = "skip"
    """How a ranked baseline (cosine, BM25, hybrid, full context) fills a token budget: ``skip``
    a unit that would overflow and go on down the ranking, or ``stop`` at the first one."""
    n_seeds: int | None = None
    """Seed threads taken by initial score before propagation; None = max(2, round(B / 2)) with
    B = :attr:`pool_budget` (at most :data:`MAX_BUDGET`), so the candidate pool grows with the budget."""
    neighborhood_cap: int | None = None
    """Most threads in the neighbourhood H_q (seeds first, then the best-scored neighbours);
    None = max(n_seeds, round(3 B / 4)) (at most :data:`MAX_BUDGET`)."""

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen
        set_("token_budget", _whole("token_budget", self.token_budget, 1, MAX_TOKEN_BUDGET, none_ok=True))
        if self.budget is None and self.token_budget is None:
            raise ConfigError("`budget` may be None (no unit cap) only with a `token_budget`")
        set_("budget", _whole("budget", self.budget, 1, MAX_BUDGET, none_ok=True))
        set_("hops", _whole("hops", self.hops, 0, MAX_HOPS))
        if self.fill not in FILLS:
            raise ConfigError(f"`fill` must be one of {', '.join(map(repr, FILLS))} (got {self.fill!r})")
        set_("n_seeds", _whole("n_seeds", self.n_seeds, 1, MAX_BUDGET, none_ok=True))
        set_("neighborhood_cap", _whole("neighborhood_cap", self.neighborhood_cap, 1, MAX_BUDGET, none_ok=True))
        if self.neighborhood_cap is not None and self.neighborhood_cap < (self.n_seeds or 1):
            raise ConfigError(f"`neighborhood_cap` must be >= `n_seeds` ({self.n_seeds or 1}) "
                              f"(got {self.neighborhood_cap!r})")

    @property
    def pool_budget(self) -> int:
        """The B that sizes the candidate pool (``n_seeds``, ``neighborhood_cap``) and the priority
        cap kappa = 1 / B_q: ``budget``, or with a token budget B_T = max(1, round(T /
        TOKENS_PER_UNIT)), whatever the unit cap. The one home of this rule."""
        if self.token_budget is None:
            return self.budget
        return max(1, round(self.token_budget / TOKENS_PER_UNIT))

    def resolved(self, cfg=None) -> "QueryParams":
        """The params with the pool sizes filled in from :attr:`pool_budget` and, given the method
        ``cfg`` (a ``SelectConfig``), its per-query ablation applied (``seed_only``: no hops).
        Idempotent."""
        B = self.pool_budget
        # derived sizes stop at MAX_BUDGET (the bound of the fields a caller may set): a token budget
        # up to MAX_TOKEN_BUDGET sizes B_T = T / 50 past it, and nobody asked for these sizes
        ns = self.n_seeds if self.n_seeds is not None else min(MAX_BUDGET, max(2, round(B / 2)))
        cap = (self.neighborhood_cap if self.neighborhood_cap is not None else
               min(MAX_BUDGET, max(ns, round(3 * B / 4))))
        hops = 0 if (cfg is not None and cfg.ablation == "seed_only") else self.hops
        if (ns, cap, hops) == (self.n_seeds, self.neighborhood_cap, self.hops):
            return self
        return replace(self, n_seeds=ns, neighborhood_cap=cap, hops=hops)

    @property
    def shape_key(self) -> tuple:
        """What decides a resolved query's candidate pool: queries that share it share steps 1-3's
        shapes (the tensor backend batches them together)."""
        return self.n_seeds, self.neighborhood_cap, self.hops

    KIND = "query parameter"


FIELDS = tuple(f.name for f in fields(QueryParams))
"""Names of the per-query fields (a dict of method and query fields splits on them:
:func:`split_fields`)."""


METHOD_DEFAULTS = QueryParams()
"""What a query gets for a field that neither it nor its collection names."""


def merge_params(given: Mapping | None = None, defaults: QueryParams | None = None,
                 limits: QueryLimits | None = None) -> QueryParams:
    """The one rule every front (CLI, ``Memory``, HTTP, MCP, ``score``) builds a query's params by:
    each field is the request's (``given``: the fields the request names, left-out ones absent),
    else the collection's (``defaults``: the ``Memory``'s or the server's; None = none), else the
    method's (:data:`METHOD_DEFAULTS`).

    ``budget`` has one more step: a request that names a ``token_budget`` (not None) and no
    ``budget`` has no unit cap (T sizes the workspace by itself); and when neither the result's
    ``budget`` nor its ``token_budget`` is set and the request named no ``budget`` (a request that
    turns off the collection's T, whose B was left out), B is the method's.

    :param limits: the front's bounds, checked on the merged values (:class:`LimitError`)
    :raises ConfigError: a field the request names that ``QueryParams`` has not, or a value out of
        range (the message names the field in backquotes)
    """
    given = {} if given is None else given
    unknown = [k for k in given if k not in FIELDS]
    if unknown:
        raise ConfigError(f"unknown query parameter{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(f'`{k}`' for k in unknown)}; the fields are {', '.join(FIELDS)}")
    base = METHOD_DEFAULTS if defaults is None else defaults
    vals = {k: given[k] if k in given else getattr(base, k) for k in FIELDS}
    if "budget" not in given:
        if given.get("token_budget") is not None:
            vals["budget"] = None
        elif vals["budget"] is None and vals["token_budget"] is None:
            vals["budget"] = METHOD_DEFAULTS.budget
    if limits is not None:
        limits.check(vals)
    try:
        return _params(*vals.values())
    except TypeError:  # an unhashable value: QueryParams names the field
        return QueryParams(**vals)


@lru_cache(maxsize=4096)
def _params(*vals) -> QueryParams:
    """The checked ``QueryParams`` of its field values, cached: a server's batches mostly repeat a few."""
    return QueryParams(**dict(zip(FIELDS, vals)))


def split_fields(d: dict) -> tuple[dict, dict]:
    """``(method fields, query fields)`` of a flat dict of ``SelectConfig`` and ``QueryParams`` fields
    (a stored run config, a CLI's options)."""
    return {k: v for k, v in d.items() if k not in FIELDS}, {k: v for k, v in d.items() if k in FIELDS}


def per_query(params: "QueryParams | Sequence[QueryParams] | None", n: int, cfg=None) -> list[QueryParams]:
    """``n`` resolved params from one for all (None = the defaults) or one per query."""
    seed_only = cfg is not None and cfg.ablation == "seed_only"
    if params is None or isinstance(params, QueryParams):
        return [_resolved(params or _DEFAULT, seed_only)] * n
    params = list(params)
    if len(params) != n:
        raise ConfigError(f"{n} queries but {len(params)} query params")
    out, seen = [], {}
    for i, p in enumerate(params):
        if not isinstance(p, QueryParams):
            raise ConfigError(f"params[{i}] must be a QueryParams (got {type(p).__name__})")
        r = seen.get(p)
        if r is None:
            r = seen[p] = _resolved(p, seed_only)
        out.append(r)
    return out


_DEFAULT = QueryParams()
_SEED_ONLY = SimpleNamespace(ablation="seed_only")
"""What :meth:`QueryParams.resolved` reads of a method: its ablation."""


@lru_cache(maxsize=1024)
def _resolved(p: "QueryParams", seed_only: bool) -> "QueryParams":
    """``p.resolved(cfg)`` for a method with (``seed_only``) or without the seed-only ablation, kept
    (params are frozen: building and checking one cost 50 us a call)."""
    return p.resolved(_SEED_ONLY if seed_only else None)
