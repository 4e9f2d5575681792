"""The engine client: the one selection call under every front (issue 43 item 1).

Every selection, whoever asks, goes the same way, and it is written out here once::

    front (Memory / AsyncMemory, serve's batch worker, trawmem query, MCP, score, planned)
      | parses `where` once (data.filters.parse_filter -> Filter), merges QueryParams once
      v
    select(engines, [Request(bank_id, question | vector, params, where, date, as_of)], encode=...)
      | 1. encode the questions that bring no vector (one encoder call)
      | 2. per `as_of` day: a dated engine over the asked banks (engines.dated)
      | 3. each request's filter -> its unit mask, once (engine.masks_of)
      | 4. one engine call per day (run: engine.select_units), or the planner over run
      v
    [Selection(units, bank, keep, dated)]  -> the front assembles its workspace from these
                                              (SelectedWorkspace.of / select.workspace.assemble)

The fronts still own what is theirs: checking their input and naming it in their errors, which
banks they serve (``memory.core.MemoryCore.ensure``), their locks and threads, and how a
workspace is rendered for them (a response body, a record). What they no longer own is the
sequence above: :func:`select` runs it, and :func:`run` is the one place in the package that calls
an engine's ``select_units`` (``tests/select/test_engine_client.py`` reads the source to hold it).

``engines`` is what the served engine offers (``memory.engines.ServedEngine``: ``engine``,
``banks``, ``bank(id)`` and ``dated(banks, day)``); a bare ``SelectionEngine`` or TriMem engine
(``score``, ``eval``) is wrapped by :class:`Bare`, which has no dated engines. The client sits in
the ``select`` layer, so that ``score`` and ``eval`` (below ``memory``) call it too; the served
engine stays in ``memory`` (it counts its tables' bytes for the resident budget, a memory concern)
and is passed in.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError
from .params import QueryParams


@dataclass(eq=False)
class Request:
    """One query: a bank, a question (or its vector), one ``QueryParams``, and optionally a parsed
    filter, a "now" and a day whose facts to show. The client reads these fields only: an object
    that has them (the server's ``serve.service.SelectItem``) is a request as it is."""

    bank_id: str
    question: str
    params: QueryParams
    vector: np.ndarray | None = None
    """The question's unit-norm vector, or None to encode ``question``."""
    where: object = None
    """A parsed ``data.filters.Filter`` (parsed once, at the front's door), or None."""
    date: datetime | None = None
    """The question's "now" for the date-dependent terms (None: none)."""
    as_of: str | None = None
    """An ISO day or instant: the facts shown are those valid then (None: the current ones)."""


@dataclass(eq=False)
class Selection:
    """What one request selected, and what its workspace is assembled from."""

    units: list[int]
    """Unit indices into :attr:`bank`, in pick order."""
    bank: object
    """The bank the engine selected from (its unit view; for ``as_of``, the dated one)."""
    keep: np.ndarray | None = None
    """The request's unit mask (its filter's; None: none): the workspace hides the heads of threads it cut."""
    dated: bool = False
    """Whether the request's date was used."""
    planned: object = None
    """The planner's result for this request (``eval.planned.PlannedPick``), or None."""


class Bare:
    """A bare engine (``SelectionEngine`` or ``TriMemEngine``) as :func:`select` takes engines: no
    dated engine (``as_of`` needs the served engine's unit views)."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def banks(self) -> dict:
        return {b: None for b in self.engine.bank_ids}

    def bank(self, bank_id: str):
        view = getattr(self.engine, "view", None)
        if view is not None:
            return view(bank_id)
        snap = self.engine.snapshot
        return snap.infos[snap.bank_index(bank_id)].bank

    def dated(self, banks, day):
        raise ConfigError("`as_of` needs the served engine (memory.core.served_engine), not a bare engine")


def run(engine, bank_ids: Sequence[str], questions: Sequence[str], Z, params, dates=None,
        masks=None) -> list[list[int]]:
    """The engine's picks (``select_units``) for the queries: the one call of an engine's selection
    in the package. ``params``: one ``QueryParams`` or one per query; ``dates``: each query's "now"
    or None (all None: passed as None); ``masks``: each query's unit mask (or None), or None."""
    if dates is not None and all(d is None for d in dates):
        dates = None
    kw = {} if masks is None else {"masks": masks}
    return engine.select_units(list(bank_ids), list(questions), Z, dates=dates, params=params, **kw)


def vectors(requests: Sequence[Request], encode: Callable[[list[str]], np.ndarray] | None,
            dim: int | None = None) -> np.ndarray:
    """``[Q, d]`` float32: each request's vector, encoded (one ``encode`` call) where it brings none
    (``dim``: the width when no request is encoded; default the given vectors')."""
    todo = [i for i, r in enumerate(requests) if r.vector is None]
    enc = None
    if todo:
        if encode is None:
            raise ConfigError("requests without a vector need an encoder")
        enc = np.asarray(encode([requests[i].question for i in todo]), dtype=np.float32)
    width = enc.shape[1] if enc is not None else dim or int(np.asarray(requests[0].vector).shape[-1])
    Z = np.empty((len(requests), width), dtype=np.float32)
    if todo:
        Z[todo] = enc
    for i, r in enumerate(requests):
        if r.vector is not None:
            Z[i] = r.vector
    return Z


Planner = Callable[..., list]
"""``planner(engine, bank_ids, questions, Z, params, dates, masks) -> [PlannedPick]``: a planned
selection (``eval.planned.planned_select`` bound to its LLM and plans), which selects through :func:`run`."""


def select(engines, requests: Sequence[Request], *, encode: Callable[[list[str]], np.ndarray] | None = None,
           dim: int | None = None, Z=None, planner: Planner | None = None,
           isolate: bool = False) -> list[Selection | Exception]:
    """The selections of ``requests`` (see the module docstring), in order.

    :param engines: the served engine (``memory.engines.ServedEngine``) or a :class:`Bare` one
    :param encode: ``texts -> [n, dim]`` query vectors, for requests without a vector
    :param dim: the vectors' width when none is encoded (default: the given vectors')
    :param Z: the requests' vectors already made (``[Q, d]``; then ``encode`` is not called)
    :param planner: a planned selection in place of the engine's own (one ``QueryParams`` for all)
    :param isolate: a day's failure (its dated engine, its engine call) fails only that day's
        requests (their entries are the exception); else it is raised
    """
    requests = list(requests)
    if not requests:
        return []
    if Z is None:
        Z = vectors(requests, encode, dim)
    out: list = [None] * len(requests)
    days: dict = {}
    for i, r in enumerate(requests):
        days.setdefault(r.as_of, []).append(i)
    for day, idx in days.items():
        try:
            one = len(days) == 1  # the usual batch: no copy of the requests and their vectors
            _select_day(engines, day, requests if one else [requests[i] for i in idx], Z if one else Z[idx],
                        planner, out, idx)
        except Exception as e:  # noqa: BLE001 - isolate: fails this day's requests only
            if not isolate:
                raise
            for i in idx:
                out[i] = e
    return out


def _select_day(engines, day, reqs: list[Request], Z, planner, out: list, idx: list[int]) -> None:
    """One engine call for ``reqs`` (all of one ``as_of`` day), into ``out[idx]``."""
    eng = engines if day is None else engines.dated({r.bank_id: engines.banks[r.bank_id] for r in reqs}, day)
    engine = eng.engine
    bids = [r.bank_id for r in reqs]
    wheres = [r.where for r in reqs]
    masks = engine.masks_of(bids, wheres) if any(w is not None for w in wheres) else None
    dates = [r.date for r in reqs]
    dates = None if all(d is None for d in dates) else dates
    if planner is None:
        picks, plans = run(engine, bids, [r.question for r in reqs], Z, [r.params for r in reqs], dates, masks), None
    else:
        if len({r.params for r in reqs}) > 1:
            raise ConfigError("params: a planned selection takes one QueryParams for all queries")
        plans = planner(engine, bids, [r.question for r in reqs], Z, reqs[0].params, dates, masks)
        picks = [p.units for p in plans]
    for k, (i, r) in enumerate(zip(idx, reqs)):
        out[i] = Selection(list(picks[k]), eng.bank(r.bank_id), None if masks is None else masks[k],
                           r.date is not None, None if plans is None else plans[k])


__all__ = ["Bare", "Request", "Selection", "run", "select", "vectors"]
