"""The offline scoring job: questions -> workspaces JSONL, single process (the Ray runner reuses it).

:class:`Scorer` holds the banks of one group with what selection needs over them (the batched
engine by default, or per-bank contexts for the reference path and the baselines) and turns a
list of :class:`~trawmem_gpu.score.items.ScoreItem` into output records. :func:`run_score`
drives it over a collection: it skips ids already in the output, processes the rest in batches
of whole banks (each batch loads only its banks), appends each batch with one fsync'd write,
and reports questions/s and a time split.

Output record (one JSON line per question): ``id``, ``bank_id``, ``question``, ``date``,
``units`` (selected unit ids in selection order), ``workspace`` (the rendered text),
``tokens`` and ``tokenizer``, ``config`` (method, engine, budget, hops, ablation, head, encoder
and the sha of the full selection config, which the ``.meta.json`` sidecar holds),
``bank_digest`` (:func:`trawmem_gpu.store.verify.bank_digest` of the bank it was selected
from), ``eval`` (official and evidence metrics, when the item has gold) and ``answer`` (with
``--answer-llm``; ``null`` plus ``answer_error`` when the request failed after its retries).
Records hold no timings, so the same job gives the same lines however it is run.

A resumed run checks the records already written against its input (``score.resume``).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import InputError
from ..eval.longmemeval import DEFAULT_KS, question_record, unit_sessions
from ..select.config import SelectConfig
from ..select.params import QueryParams, merge_params, split_fields
from ..store.bank import Bank
from ..store.bursts import unit_members
from ..store.verify import bank_digest
from ..tokens import TOKENIZER_NAME, count_tokens
from ..select.workspace import assemble, headings_for
from .items import ScoreItem
from .resume import RESUME_FIELDS, resume_todo, say_resume
from .writer import ResumableJsonl


METHODS = ("trawmem", "cosine", "bm25", "hybrid", "full", "trimem")


@dataclass
class ScoreSpec:
    """What each question gets: the method and its configuration (the job's identity)."""

    method: str = "trawmem"
    """``trawmem``, a baseline: ``cosine``, ``bm25``, ``hybrid`` (RRF, k = 60), ``full``, or ``trimem``
    (``select.trimem.method`` without query planning: the question is the only search)."""
    select: dict = field(default_factory=lambda: {**SelectConfig().to_dict(), **QueryParams().to_dict()})
    """The ``SelectConfig`` and the ``QueryParams`` every question gets, as one flat dict (the
    params' ``budget``, ``token_budget`` and ``fill`` are also the baselines')."""
    engine: str = "batched"
    """TrawMem path: ``batched`` (``SelectionEngine``) or ``reference`` (``select_reference``)."""
    head: str | None = None
    """Learned role head file (safetensors), or None for the hand-set roles."""
    ks: tuple = DEFAULT_KS
    """k of the official metrics (``--k``)."""
    threads: int | None = None
    """Worker threads of the batched engine (None: torch's thread count)."""
    answer_llm: str | None = None
    """LLM spec for answers (``--answer-llm``), or None."""
    answer_max_tokens: int = 96
    layers: tuple = ("turns",)
    """The layers selection takes units from (``--layers``: ``store.view.unit_view``; the banks must
    hold them). Left out of the job's identity while it is the default (older jobs resume)."""

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"unknown `method` {self.method!r}; choose from {', '.join(METHODS)}")
        if self.engine not in ("batched", "reference"):
            raise InputError(f"unknown `engine` {self.engine!r}; choose 'batched' or 'reference'")
        self.ks = tuple(int(k) for k in self.ks)
        if not self.ks or min(self.ks) < 1:
            raise InputError(f"`ks` must list positive integers, got {self.ks}")
        self.config(), self.params()  # validates the selection config
        from ..store.view import parse_units

        self.layers = parse_units(self.layers)

    def config(self) -> SelectConfig:
        """The method."""
        return SelectConfig.from_dict(split_fields(self.select)[0])

    def params(self) -> QueryParams:
        """What every question asks for (B, H, T): the query fields ``select`` names over the
        method's defaults, by the one rule of every front (``select.params.merge_params``)."""
        return merge_params(split_fields(self.select)[1])

    def to_dict(self) -> dict:
        d = asdict(self) | {"ks": list(self.ks), "layers": list(self.layers)}
        if tuple(self.layers) == ("turns",):
            del d["layers"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ScoreSpec":
        return cls(**d)

    def tag(self, encoder_id: str) -> dict:
        """The short config stamped on every record."""
        cfg, qp = self.config(), self.params()
        sha = hashlib.sha256(json.dumps(self.select, sort_keys=True).encode()).hexdigest()[:12]
        return {"method": self.method, "engine": self.engine if self.method == "trawmem" else None,
                "budget": qp.budget, "token_budget": qp.token_budget, "hops": qp.hops, "ablation": cfg.ablation,
                "head": Path(self.head).name if self.head else None, "encoder": encoder_id, "select_sha": sha,
                **({"layers": list(self.layers)} if tuple(self.layers) != ("turns",) else {})}


class Scorer:
    """Selection over one group of banks; ``score(items)`` -> output records in item order."""

    def __init__(self, banks: list[Bank], spec: ScoreSpec, encoder=None, head=None, llm=None,
                 contexts: dict | None = None):
        if not banks:
            raise ValueError("Scorer needs at least one bank")
        from ..store.view import unit_view

        self.spec = spec
        self.cfg, self.qp = spec.config(), spec.params()
        banks = [unit_view(b, spec.layers) for b in banks]
        self.banks = {b.bank_id: b for b in banks}
        enc_ids = {b.encoder_id for b in banks}
        if len(enc_ids) != 1:
            raise InputError(f"banks of one job were encoded with different encoders: {sorted(enc_ids)}")
        self.encoder_id = banks[0].encoder_id
        self._build_cfg = banks[0].build_config
        if encoder is not None and encoder.id != self.encoder_id:
            raise InputError(f"banks were encoded with {self.encoder_id!r}, the configured encoder is {encoder.id!r}")
        self._encoder = encoder
        if head is None and spec.head:
            from ..head import load_head

            head = load_head(spec.head)
        self.head = head
        self.llm = llm
        self.tag = spec.tag(self.encoder_id)
        self.engine = None
        self._ctx: dict = contexts if contexts is not None else {}
        """bank id -> BankContext (pass one dict to share contexts between scorers of one process)."""
        self.timings: dict[str, float] = {}
        self._digest: dict[str, str] = {}
        t0 = time.perf_counter()
        if spec.method == "trawmem" and spec.engine == "batched":
            from ..select.engine import SelectionEngine

            kw = {"threads": spec.threads} if spec.threads else {}
            self.engine = SelectionEngine(list(banks), self.cfg, head=head, **kw)
        self.trimem = None
        if spec.method == "trimem":
            from ..select.trimem.method import TriMemRankers

            self.trimem = TriMemRankers.prepared(self.banks)
        self._lap("setup", t0)

    def _lap(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + now - t0
        return now

    def context(self, bank_id: str):
        from ..select.context import BankContext

        if bank_id not in self._ctx:
            t0 = time.perf_counter()
            self._ctx[bank_id] = BankContext.of(self.banks[bank_id])
            if self.qp.token_budget is not None:  # the token costs too: per-bank setup
                self._ctx[bank_id].token_costs(headings_for(self.spec.method, self.cfg))
            self._lap("setup", t0)
        return self._ctx[bank_id]

    def select(self, items: list[ScoreItem], Z: np.ndarray) -> tuple[list[list[int]], list]:
        """``(picks, masks)``: selected bank-local unit indices per item, in selection (rank)
        order, and each item's unit mask (its filter's, made once; None: none), which its
        workspace is assembled with. The batched engine selects through the engine client."""
        from ..data.filters import parse_filter
        from ..select import baselines, client
        from ..select.reference import select_reference
        from ..select.restrict import unit_mask

        for it in items:
            if it.bank_id not in self.banks:
                raise InputError(f"question {it.id!r}: unknown bank id {it.bank_id!r}")
        dates = [datetime.fromisoformat(it.date) if it.date else None for it in items]  # "now" per question
        wheres = [parse_filter(it.where) for it in items]  # the records' JSON, parsed once here
        if self.engine is not None:
            got = client.select(client.Bare(self.engine), [
                client.Request(it.bank_id, it.question, self.qp, where=w, date=d)
                for it, w, d in zip(items, wheres, dates)], Z=Z)
            return [g.units for g in got], [g.keep for g in got]
        if self.trimem is not None:
            from ..select.trimem.plan import plain_plan

            keeps = [unit_mask(self.trimem[it.bank_id].view, w) for it, w in zip(items, wheres)]
            return [self.trimem[it.bank_id].units(plain_plan(it.question), np.asarray(z)[None, :], self.qp, keep=k)
                    for it, z, k in zip(items, Z, keeps)], keeps
        ctxs = [self.context(it.bank_id) for it in items]  # outside the selection timing, as the engine's setup
        out, keeps = [], []
        for it, ctx, z, now, w in zip(items, ctxs, Z, dates, wheres):
            m, keep = self.spec.method, unit_mask(ctx.bank, w)
            if m == "trawmem":
                out.append(select_reference(ctx, it.question, z, self.cfg, self.qp, head=self.head, now=now,
                                            keep=keep).units)
            else:
                out.append(baselines.baseline_units(m, ctx, it.question, z, self.cfg, self.qp, keep=keep))
            keeps.append(keep)
        return out, keeps

    @property
    def encoder(self):
        """The banks' encoder, loaded on first use (callers that pass query vectors never load it)."""
        if self._encoder is None:
            self._encoder = encoder_for(self._build_cfg, self.encoder_id)
        return self._encoder

    def encode(self, items: list[ScoreItem]) -> np.ndarray:
        return self.encoder.encode([it.question for it in items], is_query=True)

    def score(self, items: list[ScoreItem], Z: np.ndarray | None = None) -> list[dict]:
        """Output records for ``items`` (all of whose banks this scorer holds)."""
        if not items:
            return []
        t0 = time.perf_counter()
        if Z is None:
            Z = self.encode(items)
        t0 = self._lap("encode", t0)
        picks, keeps = self.select(items, Z)
        t0 = self._lap("select", t0)
        recs = []
        for it, p, keep in zip(items, picks, keeps):
            bank = self.banks[it.bank_id]
            if it.bank_id not in self._digest:
                self._digest[it.bank_id] = bank_digest(bank)
            if self.trimem is not None:  # the workspace is the unit view's: facts, turns, profiles
                bank = self.trimem[it.bank_id].view
            ws = assemble(bank, it.question, p, headings_for(self.spec.method, self.cfg), keep)
            text = ws.render()
            ranked = [m for u in p for m in unit_members(bank.turns[int(u)])]  # a burst: its messages
            rec = {"id": it.id, "bank_id": it.bank_id, "question": it.question, "date": it.date, "units": ranked,
                   "workspace": text, "tokens": count_tokens(text), "tokenizer": TOKENIZER_NAME, "config": self.tag,
                   "bank_digest": self._digest[it.bank_id], **({"where": it.where} if it.where else {})}
            if it.gold is not None:
                ids = [m for t in bank.turns for m in unit_members(t)]
                rec["eval"] = question_record(it.id, it.qtype, ranked, it.gold, ids, rec["tokens"], self.spec.ks,
                                              unit_sessions(ids, [t.session for t in bank.turns
                                                                  for _ in unit_members(t)]))
            recs.append(rec)
        t0 = self._lap("render", t0)
        if self.llm is not None:
            self._answer(items, recs)
            self._lap("answer", t0)
        return recs

    def _answer(self, items: list[ScoreItem], recs: list[dict]) -> None:
        from ..llm.prompts import answer_prompt
        from ..llm.structured import clean_answer

        convs = []
        for it, r in zip(items, recs):
            q = it.question if not it.date else f"{it.question}\n(The question is asked on {it.date}.)"
            convs.append(answer_prompt(None).messages(context=r["workspace"], question=q))
        from ..llm.grounding import answer_problem
        from ..llm.structured import Outcome, fell_back

        res = self.llm.chat(convs, max_tokens=self.spec.answer_max_tokens, temperature=0.0, desc="answer")
        refused = []
        for it, r, x in zip(items, recs, res):
            r["answer"] = clean_answer(x.text) if x.error is None else None
            if x.error is not None:
                r["answer_error"] = str(x.error)
            elif (why := answer_problem(r["answer"], it.question, r["workspace"])) is not None:
                # an echo of the question or a copy of the workspace's format: not an answer
                r["answer_refused"], r["refused_answer"], r["answer"] = why, r["answer"], None
                refused.append(Outcome(status="refused", why=why))
        self.llm.usage.note("answer", checked=sum(x.error is None for x in res), refused=len(refused))
        if refused:
            fell_back(self.llm, "answer", refused, "answer")


def encoder_for(build_config: dict | None, encoder_id: str | None):
    """The (cached) encoder a bank's build config names; it must produce ``encoder_id``."""
    from ..ingest.config import BuildConfig
    from ..encode import get_encoder

    enc = get_encoder(BuildConfig.from_dict(build_config).encoder if build_config else "minilm")
    if encoder_id is not None and enc.id != encoder_id:
        raise InputError(f"banks were encoded with {encoder_id!r}, the configured encoder is {enc.id!r}")
    return enc


def collection_encoder(coll):
    """The encoder of a collection's banks (read from one bank's metadata, no vectors loaded)."""
    from ..store.files import read_meta

    if not len(coll):
        raise InputError(f"{coll.path}: the collection holds no banks")
    meta = read_meta(coll.bank_path(coll.bank_ids[0]))
    return encoder_for(meta.get("build_config"), coll.encoder_id)


def encode_questions(items: list[ScoreItem], encoder) -> np.ndarray:
    """``[n, d]`` query vectors for ``items`` (one batched call through the embedding cache)."""
    return encoder.encode([it.question for it in items], is_query=True)


def plan_batches(items: list[ScoreItem], batch_size: int) -> list[list[ScoreItem]]:
    """Items grouped by bank (first-appearance order), cut into batches of about ``batch_size``
    questions that never split a bank, so each batch loads only its own banks."""
    by_bank: OrderedDict[str, list[ScoreItem]] = OrderedDict()
    for it in items:
        by_bank.setdefault(it.bank_id, []).append(it)
    batches: list[list[ScoreItem]] = []
    cur: list[ScoreItem] = []
    for group in by_bank.values():
        if cur and len(cur) + len(group) > batch_size:
            batches.append(cur)
            cur = []
        cur.extend(group)
    if cur:
        batches.append(cur)
    return batches


def job_meta(spec: ScoreSpec, collection: str | Path, encoder_id: str | None) -> dict:
    """What the output's sidecar records (and a resumed run must match)."""
    return {"spec": spec.to_dict(), "collection": str(Path(collection).resolve()), "encoder": encoder_id,
            "tokenizer": TOKENIZER_NAME, "package_version": __version__}


def check_banks(items: list[ScoreItem], known) -> None:
    unknown = sorted({it.bank_id for it in items if it.bank_id not in known})
    if unknown:
        raise InputError(f"{len(unknown)} questions name banks the collection does not hold: "
                         f"{', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''}")


def run_score(items: list[ScoreItem], collection: str | Path, spec: ScoreSpec, out: str | Path, *,
              batch_size: int = 1024, progress: bool = True, overwrite: bool = False, encoder=None,
              on_write=None, rescore_changed: bool = False) -> dict:
    """Score ``items`` against the banks of ``collection`` into ``out`` (resumable); returns a summary."""
    from tqdm.auto import tqdm

    from ..store import Collection
    from ..llm.factory import llm_from_args

    t_start = time.perf_counter()
    coll = Collection(collection)
    check_banks(items, coll)
    writer = ResumableJsonl(out, meta=job_meta(spec, collection, coll.encoder_id), overwrite=overwrite,
                            keep=RESUME_FIELDS)
    timings: dict[str, float] = {}

    def add(name, s):
        timings[name] = timings.get(name, 0.0) + s

    n_done = 0
    try:
        todo, redo = resume_todo(writer, items, coll, spec, rescore_changed=rescore_changed)
        if progress:
            say_resume(out, len(items), len(todo))
        head = None
        if spec.head:
            from ..head import load_head

            head = load_head(spec.head)
        llm = llm_from_args(spec.answer_llm) if spec.answer_llm else None
        from ..llm.base import LLMWork

        work = LLMWork(llm).__enter__()
        t0 = time.perf_counter()
        if todo:
            encoder = encoder or collection_encoder(coll)
            Z = encode_questions(todo, encoder)
            zrow = {it.id: i for i, it in enumerate(todo)}
        add("encode", time.perf_counter() - t0)
        bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=f"score ({spec.method})", unit="q",
                   disable=not progress)
        for batch in plan_batches(todo, batch_size):
            t0 = time.perf_counter()
            banks = [coll.load(b) for b in dict.fromkeys(it.bank_id for it in batch)]
            add("load_banks", time.perf_counter() - t0)
            scorer = Scorer(banks, spec, encoder=encoder, head=head, llm=llm)
            recs = scorer.score(batch, Z[[zrow[it.id] for it in batch]])
            for k, v in scorer.timings.items():
                add(k, v)
            t0 = time.perf_counter()
            writer.write_many(recs)
            add("write", time.perf_counter() - t0)
            n_done += len(recs)
            bar.update(len(recs))
            if on_write is not None:
                on_write(len(writer))
        bar.close()
    finally:
        writer.close()
    wall = time.perf_counter() - t_start
    summary = {"out": str(out), "questions": len(items), "scored_now": n_done,
               "skipped_already_written": len(items) - len(todo), "torn_bytes_dropped": writer.torn_bytes,
               "wall_s": wall, "questions_per_s": n_done / wall if wall > 0 else float("nan"),
               "selected_per_s": n_done / timings["select"] if timings.get("select") else None,
               "timings": timings, "runner": "single-process", **redo}
    if spec.answer_llm:
        work.__exit__(None, None, None)
        summary["llm"] = work.report()
    return summary

