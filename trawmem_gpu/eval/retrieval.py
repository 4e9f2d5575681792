"""The LoCoMo retrieval harness: evidence recall, all-evidence hit and context tokens.

Per question, the selected units are compared with the gold evidence turns; results are
reported per category and as the macro average over categories (1-4 by default), with the
tokens of the rendered workspace (named tokenizer) beside them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from .. import __version__
from ..ingest.config import BuildConfig
from ..data import load_conversations
from ..dictconfig import with_keywords
from ..errors import ConfigError, InputError
from ..notes import note
from ..paths import file_sha256
from ..select.config import SelectConfig
from ..select.params import QueryParams
from ..select.context import BankContext
from ..tokens import TOKENIZER_NAME
from ..select.workspace import assemble, headings_for

log = logging.getLogger(__name__)

METHODS = ("trawmem", "cosine", "bm25", "hybrid", "full", "trimem")
Method = Literal["trawmem", "cosine", "bm25", "hybrid", "full", "trimem"]


def given_build_config(cache_dir: str | Path | None) -> BuildConfig | None:
    """The build config of the banks in a user's ``--banks`` directory (None when there are none,
    or they cannot be read: ``banks_for`` then says what is wrong)."""
    from ..errors import BankError
    from ..store import Collection
    from ..store.files import read_meta

    if cache_dir is None or not (Path(cache_dir) / "collection.json").exists():
        return None
    try:
        coll = Collection(cache_dir)
        return BuildConfig.from_dict(read_meta(coll.bank_path(coll.bank_ids[0]))["build_config"]) if len(coll) \
            else None
    except (BankError, KeyError, TypeError, ValueError):
        return None


def _check_banks(coll, convs, data_path, build_cfg: BuildConfig) -> list:
    """The collection's banks for ``convs``, after the one shared check
    (:func:`trawmem_gpu.store.verify.verify_banks`: exactly the data's banks, each built from
    the data's turns with ``build_cfg``); a missing or corrupt bank is a ``BankError``."""
    from ..store.verify import verify_banks

    verify_banks(coll, convs, data_path, build_cfg.to_dict(), exact=True)
    return [coll.load(c.bank_id) for c in convs]


def banks_for(data_path: str | Path, build_cfg: BuildConfig | None = None, cache_dir: str | Path | None = None,
              progress: bool = True, encoder=None, *, dayfirst: bool = False, convs=None):
    """One bank per conversation of ``data_path``: ``(convs, banks, directory)``.

    ``cache_dir`` given (``trawmem eval --banks DIR``): banks already there are used only when
    they hold exactly the data's conversations, each built from exactly the data's turns (the
    turns digest) with the same build config (``build_cfg=None``: the banks' own); anything
    else, corrupt banks included, is refused with a ``BankError`` that names the bank and what to
    do. A new or empty directory is built into. Without ``cache_dir`` the banks live in an
    automatic cache keyed by the data file, build config, ``dayfirst`` and formats; a cache that
    fails the same checks is rebuilt, with a note (on stderr, from a command: ``..notes``).
    """
    from ..ingest import build_banks
    from ..ingest.cache import build_identity, default_bank_dir
    from ..errors import BankError
    from ..store import Collection

    convs = convs if convs is not None else load_conversations(data_path, dayfirst=dayfirst)
    if cache_dir is not None:
        cdir = Path(cache_dir)
        try:
            build_cfg = build_cfg or given_build_config(cdir) or BuildConfig()
            coll = Collection(cdir, create=True)
            if len(coll):
                return convs, _check_banks(coll, convs, data_path, build_cfg), cdir
        except BankError as e:
            raise BankError(f"`bank_cache`: {e}; remove {cdir} or give another `bank_cache` directory to rebuild the "
                            f"banks from {data_path}, or leave `bank_cache` unset to use the automatic cache") from None
    else:
        build_cfg = build_cfg or BuildConfig()
        cdir = default_bank_dir(build_identity(file_sha256(data_path), build_cfg, "all", dayfirst=dayfirst))
        try:
            coll = Collection(cdir, create=True)
            if len(coll):
                return convs, _check_banks(coll, convs, data_path, build_cfg), cdir
        except BankError as e:
            note(log, f"trawmem: the bank cache is unusable ({e}); rebuilding it in {cdir}")
            import shutil

            shutil.rmtree(cdir, ignore_errors=True)  # an automatic cache: nothing in it is the user's
            coll = Collection(cdir, create=True)
    hits0 = getattr(encoder, "hits", 0)
    t0 = time.perf_counter()
    banks, st = build_banks(convs, build_cfg, encoder, progress=progress)
    _stash_build_stats(banks, st, time.perf_counter() - t0, getattr(encoder, "hits", 0) - hits0)
    coll.put_many(banks)
    return convs, banks, cdir


def _stash_build_stats(banks, st: dict, wall_s: float, embedding_cache_hits: int) -> None:
    """Keep each bank's share (by units) of the batch build seconds in ``bank.stats["build"]``
    (stored with the bank, so a cached bank still knows what it cost to build)."""
    n = max(1, sum(b.n_units for b in banks))
    for b in banks:
        share = b.n_units / n
        d = {k: round(float(v) * share, 4) for k, v in st.items() if k.endswith("_s")}
        d.update({"wall_s": round(wall_s * share, 4), "share": round(share, 6), "batch_banks": len(banks),
                  "batch_units": n, "embedding_cache_hits": int(embedding_cache_hits)})
        b.stats = {**(b.stats or {}), "build": d}


def _scores(selected_ids: list[str], gold: tuple[str, ...]) -> tuple[float, float]:
    g = set(gold)
    s = set(selected_ids)
    return len(g & s) / len(g), float(g <= s)


def layer_scores(units: list, gold: tuple[str, ...]) -> dict:
    """With facts or profiles as units: the evidence recall with citations (gold turns shown, or
    cited by a shown fact or profile section: ``store.view.LayerUnit.cited_turns``), its
    all-evidence hit, and the mix (turns, facts, profile sections shown)."""
    from ..store.bursts import unit_members
    from ..store.view import layer_counts

    g = set(gold)
    reached = {m for u in units if getattr(u, "layer", "turns") == "turns" for m in unit_members(u)}
    reached |= {t for u in units for t in getattr(u, "cited_turns", ())}
    mix = layer_counts(units)
    return {"evidence_recall_cited": len(g & reached) / len(g), "all_evidence_hit_cited": float(g <= reached),
            "n_turns": mix["turns"], "n_facts": mix["facts"], "n_profiles": mix["profiles"]}


LAYER_KEYS = ("evidence_recall_cited", "all_evidence_hit_cited", "n_turns", "n_facts", "n_profiles")
"""The keys :func:`layer_scores` adds to a record (and ``run_eval`` to its aggregates)."""


def layered_banks(banks, data_path, units, facts: str | None, encoder, *, dayfirst: bool = False) -> list:
    """``banks`` as selection sees them with ``units`` (``store.view.unit_view``). ``facts``
    (``locomo``): banks without a facts layer get LoCoMo's observations of ``data_path`` first
    (encoded, not stored); ``None``: the layers must be in the banks already (``build --facts``)."""
    from ..ingest.layers.facts import attach_facts
    from ..store.view import parse_units, unit_view

    units = parse_units(units)
    if facts not in (None, "none"):
        bare = [b for b in banks if not b.facts]
        got, _ = attach_facts(bare, facts, encoder, input_path=data_path, dayfirst=dayfirst)
        by_id = {b.bank_id: b for b in got}
        banks = [by_id.get(b.bank_id, b) for b in banks]
    return [unit_view(b, units) for b in banks]  # with the turns alone: the burst view (the bank itself without bursts)


def aggregate(records: list[dict], keys=("evidence_recall", "all_evidence_hit", "context_tokens"),
              categories=(1, 2, 3, 4)) -> dict:
    """Per-category means and their macro average over the categories present."""
    per = {}
    for c in categories:
        rs = [r for r in records if r["category"] == c]
        if rs:
            per[str(c)] = {k: float(np.mean([r[k] for r in rs])) for k in keys} | {"n": len(rs)}
    macro = {k: float(np.mean([per[c][k] for c in per])) for k in keys} if per else {}
    return {"macro": macro, "per_category": per}


def _require_questions(convs, data_path, categories) -> None:
    n_all = sum(len(c.questions) for c in convs)
    n = sum(1 for c in convs for q in c.questions if q.category in categories and q.evidence)
    if not n:
        cats = ",".join(map(str, categories))
        raise InputError(f"{data_path}: no question with gold evidence in categories {cats} ({n_all} questions in "
                         f"all); eval needs LoCoMo-style 'qa' entries with 'evidence'" +
                         ("" if n_all else " (a history file without questions can be built, not evaluated)"))


@dataclass(frozen=True)
class EvalOptions:
    """What :func:`run_eval` runs besides the method and the configs (its keywords)."""

    categories: tuple = (1, 2, 3, 4)
    """The question categories scored (LoCoMo 1-4 by default)."""
    engine: str = "reference"
    """``reference`` (the per-query loop) or ``batched`` (``select.engine.SelectionEngine``)."""
    head: object = None
    """A learned role head (``head.load_head``), or None."""
    progress: bool = True
    """Progress bars."""
    bank_cache: str | Path | None = None
    """The bank directory to reuse or build (``--banks``; None: the automatic cache)."""
    keep_records: bool = True
    """Keep the per-question records in the result (``records``)."""
    banks_and_convs: object = None
    """Preloaded ``(convs, banks)``: nothing is loaded or built."""
    query_vecs: object = None
    """Preloaded question vectors (``[Q, d]``), else they are encoded."""
    dayfirst: bool = False
    """Read ambiguous dates day first."""
    params: QueryParams | None = None
    """The query parameters of every question (B, H, T; None: the defaults)."""
    units: object = ("turns",)
    """The layers selected from (:func:`layered_banks`)."""
    facts: str | None = None
    """How facts are made for a layered run (:func:`layered_banks`)."""
    plan_llm: object = None
    """The planning LLM of trimem or planned TrawMem (None: the question is the only search)."""
    prompts: object = None
    """trimem's ``ingest.layers.prompts.PromptSet``."""
    follow_up: bool = False
    """Planned TrawMem's second stage."""


def run_eval(data_path: str | Path, method: Method = "trawmem", select_cfg: SelectConfig | None = None,
             build_cfg: BuildConfig | None = None, options: EvalOptions | None = None, **kw) -> dict:
    """Select for every question of ``categories`` and score against the gold evidence, every
    question with the query parameters ``params`` (B, H, T; None = the defaults). ``options``:
    :class:`EvalOptions`, or its fields as keywords.

    ``method="trimem"`` (``select.trimem.method``) needs banks with facts; ``plan_llm`` is its planning
    LLM (None: the question is the only search) and ``prompts`` its ``ingest.layers.prompts.PromptSet``.
    ``method="trawmem"`` with a ``plan_llm``: planned TrawMem (``eval.planned``, the batched
    engine only), its second stage with ``follow_up``; each record then has its ``plan``.

    ``build_cfg=None`` builds with the defaults, or takes the build config of the banks already
    in ``bank_cache`` (``--banks``); banks that do not match the data are refused (``banks_for``).
    A file without questions that have gold evidence in ``categories`` is an ``InputError``.
    ``units`` / ``facts``: the layers selected from (:func:`layered_banks`); with more than the turns,
    each record also has the :data:`LAYER_KEYS` (recall with citations, the mix).
    """
    o = with_keywords("run_eval", EvalOptions, options, kw)
    categories, engine, query_vecs = o.categories, o.engine, o.query_vecs
    _check_method(method, o)
    cfg = select_cfg or SelectConfig()
    qp = o.params or QueryParams()
    convs, banks, build_cfg, encoder, units, layered = _eval_banks(data_path, method, cfg, build_cfg, o)
    batched = method == "trawmem" and engine == "batched"
    # The batched engine keeps its own per-bank tables; contexts (BM25 indexes) only for the loop.
    ctxs = {} if batched or method == "trimem" else {b.bank_id: BankContext.of(b) for b in banks}
    if qp.token_budget is not None:  # per-bank setup (the token costs), outside the selection timing
        for c in ctxs.values():
            c.token_costs(headings_for(method, cfg))
    items = [(c.bank_id, q) for c in convs for q in c.questions if q.category in categories and q.evidence]
    skipped = sum(1 for c in convs for q in c.questions if q.category in categories and not q.evidence)
    t0, hits0 = time.perf_counter(), getattr(encoder, "hits", 0)
    if query_vecs is None:
        Z = encoder.encode([q.question for _, q in items], is_query=True, progress=o.progress, desc="encode questions")
    else:
        Z = query_vecs
    t_enc = time.perf_counter() - t0
    picks, t_each, t_sel, render_bank, trimem_plans, plan_picks = _select_all(method, o, cfg, qp, banks, ctxs,
                                                                              items, Z, encoder)
    t0 = time.perf_counter()
    plans = trimem_plans if plan_picks is None else [p.to_dict() for p in plan_picks]
    records = _eval_records(items, picks, t_each, render_bank, headings_for(method, cfg), layered, plans)
    t_asm = time.perf_counter() - t0
    agg = aggregate(records, categories=categories,
                    keys=("evidence_recall", "all_evidence_hit", "context_tokens") + (LAYER_KEYS if layered else ()))
    from ..data.types import EvidenceRepairs

    rep = EvidenceRepairs()
    for c in convs:
        rep.add(c.repairs)
    out = {
        "method": method, "engine": engine if method == "trawmem" else "n/a", **agg,
        "n_questions": len(records), "skipped_no_evidence": skipped,
        "config": {"select": {**cfg.to_dict(), **qp.to_dict()}, "build": build_cfg.to_dict(), "budget": qp.budget,
                   "token_budget": qp.token_budget, "hops": qp.hops, "ablation": cfg.ablation,
                   "categories": list(categories), **({"units": list(units), "facts": o.facts} if layered else {})},
        "dataset": {"path": str(data_path), "sha256": file_sha256(data_path), "evidence_repairs": rep.as_dict(),
                    "dayfirst": o.dayfirst, "skipped_empty_turns": sum(c.skipped_empty for c in convs)},
        "encoder": encoder.id, "tokenizer": TOKENIZER_NAME, "package_version": __version__,
        "selection_seconds_per_query": t_sel / max(1, len(records)),
        "timing": {"encode_questions_s": t_enc, "select_s": t_sel, "assemble_s": t_asm,
                   "question_embedding_cache_hits": getattr(encoder, "hits", 0) - hits0 if query_vecs is None else None},
    }
    _eval_extras(out, method, o, trimem_plans, plan_picks)
    if o.keep_records:
        out["records"] = records
    return out


def _check_method(method: str, o: EvalOptions) -> None:
    """The ``ValueError`` / ``ConfigError`` of a method and options that do not go together."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
    planned = method == "trawmem" and o.plan_llm is not None
    if o.plan_llm is not None and method not in ("trawmem", "trimem"):
        raise ConfigError(f"`plan_llm` applies to method trimem or trawmem, not {method}")
    if planned and o.engine != "batched":
        raise ConfigError("`plan_llm` with method trawmem runs the batched engine; set `engine` to batched")
    if o.follow_up and not planned:
        raise ConfigError("`follow_up` needs method trawmem with a `plan_llm`")


def _eval_banks(data_path, method: str, cfg: SelectConfig, build_cfg: BuildConfig | None, o: EvalOptions):
    """``(convs, banks, build_cfg, encoder, units, layered)`` of a :func:`run_eval`: the
    conversations and their banks (loaded, reused or built; layered as ``units`` / ``facts`` say)."""
    from ..data import require_locomo
    from ..encode import get_encoder

    dayfirst = o.dayfirst
    if o.banks_and_convs is None:
        require_locomo(data_path, "eval")
    if o.banks_and_convs is None:
        convs = load_conversations(data_path, dayfirst=dayfirst)
        _require_questions(convs, data_path, o.categories)
        build_cfg = build_cfg or given_build_config(o.bank_cache) or BuildConfig()
    else:
        build_cfg = build_cfg or BuildConfig()
    if cfg.ablation == "fixed_segmentation":
        build_cfg = BuildConfig(**(build_cfg.to_dict() | {"segmentation": "fixed"}))
    encoder = get_encoder(build_cfg.encoder)
    if o.banks_and_convs is None:
        convs, banks, _ = banks_for(data_path, build_cfg, o.bank_cache, o.progress, encoder, dayfirst=dayfirst,
                                    convs=convs)
    else:
        convs, banks = o.banks_and_convs
    from ..store.view import DEFAULT_UNITS, parse_units

    units = parse_units(o.units)
    if method == "trimem" and units != DEFAULT_UNITS:
        raise ConfigError("`units`: method trimem shows its own units (facts, their source turns, profiles); "
                          "leave `units` at turns")
    layered = units != DEFAULT_UNITS or method == "trimem"
    banks = layered_banks(banks, data_path, units, o.facts, encoder, dayfirst=dayfirst)  # bursts too
    return convs, banks, build_cfg, encoder, units, layered


def _select_all(method: str, o: EvalOptions, cfg: SelectConfig, qp: QueryParams, banks, ctxs: dict, items, Z,
                encoder):
    """``(picks, t_each, t_sel, render_bank, trimem_plans, plan_picks)``: every question's
    selection with ``method`` (timed), and what each workspace is rendered from."""
    from ..select.baselines import baseline_units
    from ..select.reference import select_reference

    head, plan_llm, prompts = o.head, o.plan_llm, o.prompts
    batched = method == "trawmem" and o.engine == "batched"
    planned = method == "trawmem" and plan_llm is not None
    bank_of = {b.bank_id: b for b in banks}
    t_sel = 0.0
    picks: list[list[int]] = []
    t_each: list[float] = []
    render_bank = dict(bank_of)  # what each record's workspace is rendered from (trimem: unit views)
    trimem_plans = plan_picks = None
    if method == "trimem":
        from ..select.trimem.method import TriMemRankers, trimem_select

        rankers = TriMemRankers.prepared(bank_of)  # per-bank setup, outside the selection timing
        t0 = time.perf_counter()
        tm = trimem_select(rankers, [(b, q.question) for b, q in items], Z, qp, llm=plan_llm, prompts=prompts,
                           encode=lambda xs: encoder.encode(xs, is_query=True))
        t_sel = time.perf_counter() - t0
        t_each = [t_sel / max(1, len(items))] * len(items)
        picks = [p.units for p in tm]
        trimem_plans = [p.plan.to_dict() for p in tm]
        render_bank = {b: r.view for b, r in rankers.items()}
    elif batched:
        from ..select.engine import SelectionEngine

        eng = SelectionEngine(banks, cfg, head=head)
        t0 = time.perf_counter()
        if planned:
            from .planned import planned_select

            got = planned_select(eng, [(b, q.question) for b, q in items], Z, qp, llm=plan_llm, prompts=prompts,
                                 follow_up=o.follow_up, encode=lambda xs: encoder.encode(xs, is_query=True))
            picks, plan_picks = [p.units for p in got], got
        else:
            from ..select.client import run

            picks = run(eng, [b for b, _ in items], [q.question for _, q in items], Z, qp)
        t_sel = time.perf_counter() - t0
        t_each = [t_sel / max(1, len(items))] * len(items)
    else:
        for (bid, q), z in tqdm(list(zip(items, Z)), desc=f"select ({method})", disable=not o.progress):
            ctx = ctxs[bid]
            t0 = time.perf_counter()
            if method == "trawmem":
                p = select_reference(ctx, q.question, z, cfg, qp, head=head).units
            else:
                p = baseline_units(method, ctx, q.question, z, cfg, qp)
            t_each.append(time.perf_counter() - t0)
            t_sel += t_each[-1]
            picks.append(p)
    return picks, t_each, t_sel, render_bank, trimem_plans, plan_picks


def _eval_records(items, picks, t_each, render_bank: dict, headings, layered: bool, plans) -> list[dict]:
    """One scored record per question: its workspace rendered, recall and hit against the gold,
    the layer scores of a layered run, and its plan (``plans``: one dict per question, or None)."""
    records = []
    for n, ((bid, q), p, ts) in enumerate(zip(items, picks, t_each)):
        ws = assemble(render_bank[bid], q.question, p, headings)
        rec_, hit = _scores(ws.unit_ids, q.evidence)
        records.append({"qid": q.qid, "bank_id": bid, "category": q.category, "evidence_recall": rec_,
                        "all_evidence_hit": hit, "context_tokens": ws.n_tokens, "n_selected": len(ws.unit_ids),
                        "selected": ws.unit_ids, "gold": list(q.evidence), "select_s": ts})
        if layered:
            records[-1].update(layer_scores([t for b in ws.blocks for t in b.units], q.evidence))
        if plans is not None:
            records[-1]["plan"] = plans[n]
    return records


def _eval_extras(out: dict, method: str, o: EvalOptions, trimem_plans, plan_picks) -> None:
    """The head's description, trimem's planning counts and planned TrawMem's summary, into ``out``."""
    head, plan_llm, prompts = o.head, o.plan_llm, o.prompts
    if head is not None:
        out["head"] = getattr(head, "describe", lambda: str(head))()
    if method == "trimem":
        from ..ingest.layers.prompts import PromptSet

        out["trimem"] = {"plan_llm": plan_llm.describe() if plan_llm is not None else None,
                         "prompts": (prompts or PromptSet()).describe(),
                         "planned": sum(bool(p["planned"]) for p in trimem_plans),
                         "plan_fallbacks": sum(bool(p["fallback"]) for p in trimem_plans)}
    if plan_picks is not None:
        from .planned import plan_summary

        out["plan"] = plan_summary(plan_picks, plan_llm, prompts) | {"follow_up": o.follow_up}
