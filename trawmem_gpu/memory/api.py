"""``Memory``: the Python API over one collection (add turns, select workspaces, forget).

::

    from trawmem_gpu import Memory
    mem = Memory("memories/")
    mem.add("ana-ben", [{"turn_id": "S1:1", "speaker": "Ana", "text": "...", "timestamp": "2031-03-02"}])
    ws = mem.select("ana-ben", "Where does Ben's sister live?", token_budget=800)
    print(ws.text, ws.units, ws.tokens)

Thread-safety follows the server's model (``serve/service.py``): appends and forgets of one
bank run one after another (the registry's bank lock), of different banks side by side; the
engine is touched under one lock (a selection call, or the publication of a bank an append or
forget built), so a selection sees a bank before or after a write, never a mix; encoding and
workspace assembly run outside it. The reference is ``docs/python-api.md``.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..data.types import Turn
from ..errors import ConfigError, InputError
from ..store.facts import utc_text
from .args import bank_arg, date_of, filters, pairs, query_fields, turn_ids_arg, vectors_arg
from .export import Portable
from .options import OPTION_FIELDS, MemoryOptions
from .result import SelectedWorkspace

class Memory(Portable):
    """Agent memory over the collection directory ``path`` (created empty when missing).

    :param path: the collection directory
    :param options: a :class:`~trawmem_gpu.memory.options.MemoryOptions` (encoder, method,
        params, threads, caches, head, only, create, embedding_cache, llm, units, plan_llm,
        follow_up; a docstring per field); its fields can also be given as keywords, over it
    :param query: default query fields over ``params`` (``budget=`` B, ``token_budget=`` T,
        ``hops=`` H, or any other ``QueryParams`` field), merged by ``select.params.merge_params``:
        ``token_budget`` alone means no unit cap. The result is :attr:`defaults`.
    :raises BankError: the directory is not a collection (or a damaged one)
    :raises ConfigError: the encoder is not the collection's
    """

    def __init__(self, path: str | Path, options: MemoryOptions | None = None, **kw):
        from dataclasses import replace

        from ..select.params import merge_params
        from .core import EngineSpec, MemoryCore

        if options is not None and not isinstance(options, MemoryOptions):
            raise TypeError(f"Memory() options: expected a MemoryOptions, got {type(options).__name__}")
        o = replace(options or MemoryOptions(), **{k: v for k, v in kw.items() if k in OPTION_FIELDS})
        query = {k: v for k, v in kw.items() if k not in OPTION_FIELDS}
        if o.follow_up and o.plan_llm is None:
            raise ConfigError("`follow_up` needs a `plan_llm`")
        self.defaults = merge_params(query_fields("Memory", query), o.params)
        """The ``QueryParams`` a selection gets for the fields it leaves out (the collection default)."""
        owns = (lambda b, keep=frozenset(o.only): b in keep) if o.only is not None else (lambda b: True)
        self._core = MemoryCore(path, encoder=o.encoder, engine=EngineSpec(o.method, o.threads, o.head, o.units),
                                caches=o.caches, owns=owns, create=o.create, embedding_cache=o.embedding_cache,
                                max_resident_bytes=o.max_resident_bytes)
        self.llm = o.llm
        self.plan_llm, self.follow_up = o.plan_llm, bool(o.follow_up)
        self._lock = self._core.lock
        """Held for every engine call and engine refresh (the core's engine lock)."""
        self._assembled = threading.Condition(self._lock)
        self._epoch = 0
        self._assembling: dict[int, int] = {}
        """Engine epoch -> selections picked at it and still being assembled: a forget waits for
        those picked before it (they render the old bank) before it drops the rendering caches."""

    # -- properties ---------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._core.path

    @property
    def encoder_id(self) -> str:
        return self._core.encoder.id

    def __contains__(self, bank_id: str) -> bool:
        return bank_id in self._core.registry

    def __repr__(self) -> str:
        return f"Memory({str(self.path)!r}, banks={len(self._core.registry.ids())})"

    # -- banks -----------------------------------------------------------------------------------
    def banks(self, *, within=None) -> list[dict]:
        """Every bank's counts and date range, by bank id: ``bank_id``, ``n_units``,
        ``n_threads``, ``n_sessions``, ``first_date``, ``last_date``. A quarantined bank (its
        files could not be served; ``QuarantinedBank``) is listed with ``"quarantined"``: the
        cause, and None for the counts and dates. ``within``: a caller's filter (MCP's filter-bound
        keys): the counts and dates of the turns passing it (``memory.scope``; each bank opened)."""
        from .answers import summaries

        return summaries(self._core.registry, within)

    @property
    def quarantined(self) -> dict[str, str]:
        """Bank id -> why the bank is not served (see :class:`~trawmem_gpu.errors.QuarantinedBank`)."""
        return dict(self._core.registry.quarantined)

    def turns(self, bank_id: str) -> list[Turn]:
        """The turns bank ``bank_id`` holds, in order (``UnknownBank`` when there is no such bank,
        ``QuarantinedBank`` when it is quarantined)."""
        bank = self._core.registry.get(bank_id)
        if bank is None:
            raise self._core.registry.absent(bank_id)
        self._core.touch(bank_id)
        return list(bank.turns)

    def history(self, bank_id: str, unit_id: str) -> list[dict]:
        """What happened to unit ``unit_id`` (turn, fact or profile section) of bank ``bank_id``,
        oldest first (``memory.history``): dicts of ``event`` (``added``, ``superseded``,
        ``re-embedded``, ``forgotten``, ``reinstated``), ``time`` (ISO UTC; null: stored before
        history was kept), ``cause``, and ``by`` / ``supersedes``. Events hold no content, and no
        id of a forgotten unit (``"(forgotten)"`` stands for it).

        :raises UnknownBank: no such bank, and no history of it
        :raises UnknownUnit: the bank neither holds the unit nor has a history of it
        """
        from ..errors import UnknownUnit
        from .history import unit_history

        bank_arg(bank_id)
        if not isinstance(unit_id, str):
            raise InputError(f"unit_id: expected a unit id string, got {type(unit_id).__name__}")
        evs = unit_history(self._core.registry, bank_id, unit_id)
        self._core.touch(bank_id)  # a lazy bank the history read opened is counted (and let go) as used
        if evs is None:
            raise UnknownUnit(bank_id, unit_id)
        return evs

    # -- writing ---------------------------------------------------------------------------------
    def add(self, bank_id: str, turns=None, *, messages=None, speakers=None, roles=None,
            atomic: bool = False, now=None, within=None, layers: bool | None = None) -> dict:
        """Append ``turns`` (dicts with ``turn_id``, ``speaker``, ``text``, ``timestamp``, optional
        ``caption`` and ``session``, or :class:`Turn` objects), or chat ``messages`` (``{"role",
        "content", "name"}``: ``memory.messages``, with ``speakers``, ``roles`` and ``now``), to
        bank ``bank_id`` (created on the first add), as ``build --update`` would; each item is
        answered in ``items``: ``stored``, ``already_stored`` (a retry), ``refused`` (``field``,
        ``reason``) or ``skipped``, and the valid ones are stored unless ``atomic=True`` (any
        refusal raises ``InputError`` / ``DuplicateTurns``, nothing stored). Returns the bank's
        counts plus ``created``, ``appended``, ``stored``, ``already_stored``, ``items``, ``refused``,
        and with an ``llm`` its work (``llm``: calls, retries, tokens, seconds, malformed / refused /
        fallen back; ``llm.base.LLMWork``). ``within``: as for :meth:`banks`; no refusal names another turn.

        ``layers``: extend the bank's ingest layers (those it was built with: facts, profiles) over
        the new turns as ``build --update`` does, with the Memory's ``llm`` (``ingest.layers.steps.
        AddLayers``): None, those that can run (the others are left, said in the answer's ``layers``);
        True, all or a ``ConfigError`` (nothing stored); False, none (docs/python-api.md).
        """
        from ..ingest.layers.steps import add_layers
        from ..llm.base import LLMWork
        from .answers import append_answer
        from .messages import request_batch

        bank_arg(bank_id)
        steps = add_layers(layers, self._core.encoder, self.llm)
        batch = request_batch(bank_id, turns, messages, speakers=speakers, roles=roles, atomic=atomic, now=now)
        batch.scope = within
        with LLMWork(self.llm) as work, self._core.publishing(bank_id):
            res = self._core.append(bank_id, batch, llm=self.llm, layers=steps)
            if res.bank is not None:
                self._publish(bank_id, res.bank)
        return {**append_answer(bank_id, res, within), **({"layers": steps.report} if steps and steps.report else {}),
                **({"llm": work.report()} if self.llm is not None else {})}

    def _publish(self, bank_id: str, bank) -> None:
        prepared = self._core.engines.prepare(bank)  # the slow part, outside the engine lock
        with self._lock:
            self._core.sync_engine(bank_id, prepared)
            self._core.evict(keep={bank_id})

    def add_facts(self, bank_id: str, facts) -> dict:
        """Add facts (``{"text", "source_turns"}``, optional ``subject`` and ``attribute``, ``valid_from``,
        ``id``, ...: ``memory.facts``) to bank ``bank_id``; a keyed fact supersedes, by rule, the
        current fact of its subject and attribute, which stays with ``valid_to`` and ``superseded_by``.

        :returns: ``{"bank_id", "added": [ids], "superseded": [{"old", "new", "cause"}], "n_facts"}``
        :raises UnknownBank: no such bank; :raises InputError: a malformed fact (nothing added)
        """
        from .facts import add_facts

        bank_arg(bank_id)
        res = add_facts(self._core.registry, bank_id, facts, self._core.encoder)
        self._publish(bank_id, res["bank"])
        return {"bank_id": bank_id, "added": res["added"], "superseded": res["superseded"],
                "n_facts": len(res["bank"].facts)}

    def forget(self, bank_id: str, turn_ids: Sequence[str] | None = None, *, outputs: Iterable[str | Path] = (),
               llm=None, within=None) -> dict:
        """Forget turns of a bank (``turn_ids``), or the whole bank (None), everywhere: the bank is
        rebuilt without them (as an append rebuilds it) and written atomically, then the engine's
        tables, the embedding and LLM caches and the ``score`` outputs named in ``outputs`` are
        scrubbed of them. Forgetting an id twice is not an error (``missing`` lists it); a forget
        that was killed half-way (its journal names the ``outputs`` too) is finished by the next
        open of the collection or the next forget of that bank. The bank is read from disk: turns
        another process forgot beside this Memory are dropped from its engine too (and reported
        forgotten). A quarantined bank (:attr:`quarantined`) can be forgotten whole only.

        :param llm: an LLM backend for a bank built with LLM segmentation or heads (default: the
            Memory's; without one the re-segmented sessions fall back to embedding segmentation and
            extractive heads)
        :param within: as for :meth:`banks`: only turns passing it are forgotten and listed (the others
            are ``missing``; a whole bank is refused: ``memory.scope.forget_within``)
        :returns: ``{"bank_id", "forgotten": [ids], "missing": [ids], "deleted": bool,
            "n_units": int, "cache_rows": int, "output_records": int}``
        :raises UnknownBank: no such bank (and no unfinished forget of it)
        :raises QuarantinedBank: ``turn_ids`` of a quarantined bank (forget it whole)
        """
        bank_arg(bank_id)
        turn_ids = turn_ids_arg(turn_ids)
        res = self._core.forget_stored(bank_id, turn_ids, llm or self.llm, outputs=outputs, where=within)
        prepared = self._core.prepare_forget(res)
        with self._lock:
            self._core.sync_forget(res, prepared)
            self._epoch += 1
            now = self._epoch
            self._assembled.wait_for(lambda: all(e >= now for e in self._assembling))
        return self._core.forget_summary(res, self._core.erase_copies(res), within)

    # -- selection -------------------------------------------------------------------------------
    def select(self, bank_id: str, question: str, *, params=None, date=None, vector=None, where=None, as_of=None,
               **query) -> SelectedWorkspace:
        """The workspace for ``question`` from bank ``bank_id``: ``.text`` (what an answer model
        reads), ``.units`` (the selected turns), ``.tokens``.

        :param params: the ``QueryParams`` this call starts from (default: :attr:`defaults`)
        :param query: query fields over ``params``, merged by ``select.params.merge_params`` (the
            rule of every front): ``budget=`` B, most units (with ``token_budget`` only: no cap);
            ``token_budget=`` T, most tokens of ``.text`` (None: none); ``hops=`` H, propagation
            hops over the thread graph (None: the default); or any other ``QueryParams`` field
        :param date: the question's "now" (datetime, date or date string) for the date-dependent terms
        :param vector: the question's unit-norm vector (skips encoding)
        :param where: a filter over the turns' metadata, ``{"user_id": "u1"}`` (docs/python-api.md)
        :param as_of: a date: the facts shown are those valid on it (``Fact.valid_at``; default:
            the current ones); it applies to the facts layer (``units`` with facts), not to turns
        :raises UnknownBank: no such bank
        :raises ConfigError: a budget, token budget or hops out of range (the message names the field)
        """
        return self._select("select", [(bank_id, question)], params, None if date is None else [date],
                            None if vector is None else [vector], where, as_of, query)[0]

    def select_many(self, queries: Sequence[tuple[str, str]], *, params=None, dates=None, vectors=None, where=None,
                    as_of=None, **query) -> list[SelectedWorkspace]:
        """Workspaces for many ``(bank_id, question)`` pairs: one encoder call and one batched
        engine call for all of them (what the server does for a batch). Parameters as
        :meth:`select`, for every query; ``params``: one ``QueryParams`` for all or one per query;
        ``dates`` / ``vectors``: one per query (or None); ``where``: one filter for all or one per query;
        ``as_of``: one date for all (a throwaway engine over the asked banks' facts of that day)."""
        return self._select("select_many", queries, params, dates, vectors, where, as_of, query)

    def _select(self, fn: str, queries, params, dates, vectors, where, as_of, query: dict) -> list[SelectedWorkspace]:
        """:meth:`select_many` (``fn``: the method called, which its errors name): the arguments
        checked once, then one selection through the engine client (``select.client.select``)."""
        from ..select import client

        if queries is None or isinstance(queries, (str, bytes, dict)) or not isinstance(queries, Iterable):
            raise InputError(f"queries: expected a list of (bank_id, question) pairs, got {type(queries).__name__}")
        queries = list(queries)
        if not queries:
            return []
        qps = self._params(params, query_fields(fn, query), len(queries))
        bids, qs = pairs(queries, self._core.registry)
        n = len(queries)
        flts = filters(where, n) or [None] * n
        ds = [None] * n if dates is None else [date_of(d, f"dates[{i}]") for i, d in enumerate(dates)]
        if len(ds) != n:
            raise InputError(f"dates: {len(ds)} dates for {n} queries")
        day = None if as_of is None else utc_text(date_of(as_of, "as_of"))  # a day, or an instant (UTC)
        Z = self._core.encoder.encode(qs, is_query=True) if vectors is None else vectors_arg(vectors, n, self._core.dim)
        reqs = [client.Request(b, q, p, where=f, date=d, as_of=day) for b, q, p, f, d in zip(bids, qs, qps, flts, ds)]
        from ..llm.base import LLMWork

        work = LLMWork(self.plan_llm).__enter__()
        planner = None
        if self.plan_llm is not None:  # the planner's LLM calls, before the engine is held
            if len(set(qps)) > 1:
                raise InputError("params: planned selection (plan_llm) takes one QueryParams for all queries")
            from ..eval.planned import planner as planned
            from ..select.trimem.plan import plan_queries

            planner = planned(llm=self.plan_llm, plans=plan_queries(qs, self.plan_llm, key_info=False),
                              encode=lambda t: self._core.encoder.encode(t, is_query=True), follow_up=self.follow_up)
        warm = {b: self._core.warm(b) for b in dict.fromkeys(bids)}  # cold banks opened outside the engine lock
        with self._lock:
            self._core.ensure(bids, warm)  # banks added since, opened now; the least used let go
            for i, b in enumerate(bids):
                if b not in self._core.engines.banks:  # forgotten meanwhile, or its files no longer load
                    raise self._core.registry.absent(b, f"queries[{i}]: " if n > 1 else "")
            got = client.select(self._core.engines, reqs, Z=Z, planner=planner)  # the engine client
            epoch = self._epoch
            self._assembling[epoch] = self._assembling.get(epoch, 0) + 1
        work.__exit__(None, None, None)
        llm = work.report()
        try:
            out = [SelectedWorkspace.of(s.bank, q, s.units, self._core.headings, s.dated,
                                        s.planned.searches if s.planned is not None else (), s.keep)
                   for s, q in zip(got, qs)]
            return [replace(w, llm=llm) for w in out] if llm else out
        finally:
            with self._lock:
                self._assembling[epoch] -= 1
                if not self._assembling[epoch]:
                    del self._assembling[epoch]
                self._assembled.notify_all()

    def _params(self, params, given: dict, n: int) -> list:
        """Each query's ``QueryParams``: ``given`` over ``params`` (one for all, one per query, or
        None: :attr:`defaults`) by the one rule (``select.params.merge_params``)."""
        from ..select.params import QueryParams, merge_params

        if params is None or isinstance(params, QueryParams):
            return [merge_params(given, params or self.defaults)] * n
        if isinstance(params, (str, bytes, dict)) or not isinstance(params, Iterable):
            raise InputError(f"params: expected a QueryParams or a list of them, got {type(params).__name__}")
        params = list(params)
        if len(params) != n:
            raise InputError(f"params: {len(params)} QueryParams for {n} queries")
        for i, p in enumerate(params):
            if not isinstance(p, QueryParams):
                raise InputError(f"params[{i}]: expected a QueryParams, got {type(p).__name__}")
        return [merge_params(given, p) for p in params]
