"""``trawmem query``: the workspace of one question from one bank.

It also holds what the selecting commands make of their flags at run time (the method and
query parameters, the head, the planning LLM), which ``trawmem eval`` reads when it runs.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .args import add_affinity_weights, add_head, add_llm_options, add_method, add_query_params, add_units, add_where
from ..data.types import MAX_QUESTION_CHARS
from ..errors import InputError, name_list, plural


def _select_config(a):
    """``(SelectConfig, QueryParams)``: the method and what every question asks for, from the flags."""
    from ..select.config import PAPER_HOPS, SelectConfig
    from ..select.params import FIELDS, merge_params

    paper = getattr(a, "paper", False)
    base = SelectConfig.paper() if paper else SelectConfig()
    given = {k: v for k in FIELDS if (v := getattr(a, k, None)) is not None}  # the flags given
    qp = merge_params(given, merge_params({"hops": PAPER_HOPS}) if paper else None)
    kw = {}
    if getattr(a, "headings", None) is not None:
        kw["headings"] = a.headings
    if getattr(a, "ablation", None):
        kw["ablation"] = a.ablation
    if getattr(a, "affinity_weights", None):
        from ..head.relevance import load_weights

        kw.update(affinity="learned", relevance_weights=load_weights(a.affinity_weights))
    return replace(base, **kw), qp


def _check_question(q: str) -> str:
    if not q or not q.strip():
        raise InputError("--question is empty")
    if len(q) > MAX_QUESTION_CHARS:
        raise InputError(f"--question is {len(q)} characters; the limit is {MAX_QUESTION_CHARS}")
    try:
        q.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError("--question is not valid Unicode (a lone surrogate)") from None
    return q.strip()


def _check_plan_flags(a) -> None:
    """``--plan-llm`` / ``--follow-up`` only where they apply (a one-line ``InputError`` else)."""
    spec = getattr(a, "plan_llm", None)
    if getattr(a, "follow_up", False) and not (spec and a.method == "trawmem"):
        raise InputError("--follow-up needs --method trawmem with --plan-llm")
    if spec and a.method not in ("trimem", "trawmem"):
        raise InputError(f"--plan-llm applies to --method trimem or trawmem, not {a.method}")
    if spec and a.method == "trawmem" and getattr(a, "engine", "batched") != "batched":
        raise InputError("--plan-llm with --method trawmem runs the batched engine; drop --engine reference")
    if getattr(a, "as_of", None) and (spec or a.method != "trawmem"):
        raise InputError("--as-of applies to --method trawmem without --plan-llm")


def _plan_llm(a):
    """The planning LLM of TriMem or planned TrawMem from ``--plan-llm`` (checked, cached), or None."""
    _check_plan_flags(a)
    spec = getattr(a, "plan_llm", None)
    if not spec:
        return None
    from ..llm.factory import llm_from_args, llm_options

    return llm_from_args(spec, check=True, **llm_options(a))


def _load_head(path):
    if not path:
        return None
    from ..head import load_head

    return load_head(path)


def _bank_id(a, coll) -> str:
    """``--bank-id``, or the one bank of ``coll`` when it holds one (``a.bank_id`` set to it)."""
    if a.bank_id is None:
        if len(coll) != 1:
            raise InputError(f"{coll.path} holds {plural(len(coll), 'bank')}; name one with --bank-id "
                             f"({name_list(coll.bank_ids)})")
        a.bank_id = coll.bank_ids[0]
    return a.bank_id


def _query_bank(a):
    """The bank ``query`` reads: ``--bank`` itself, or ``--bank-id`` of the collection ``--bank``."""
    from ..store import Collection, load_bank

    p = Path(a.bank)
    if (p / "meta.json").exists():
        return load_bank(p)
    coll = Collection(p)
    return coll.load(_bank_id(a, coll))


def _bank_encoder(bank):
    """The query encoder of ``bank``'s build config (MiniLM without one), checked against the bank's."""
    from ..ingest.config import BuildConfig
    from ..encode import get_encoder

    enc = get_encoder(BuildConfig.from_dict(bank.build_config).encoder if bank.build_config else "minilm")
    if enc.id != bank.encoder_id:
        raise InputError(f"bank was encoded with {bank.encoder_id!r}, the configured encoder is {enc.id!r}")
    return enc


def _query_ranked(a, q: str, qp):
    """``(workspace, extra JSON fields)`` of ``query --method`` trimem or a baseline (TrawMem has
    its own path): TriMem over the bank's facts (planned with ``--plan-llm``), a baseline over its
    unit view for ``--units``."""
    from ..store.view import DEFAULT_UNITS, parse_units, unit_view
    from ..memory import SelectedWorkspace

    bank = _query_bank(a)
    if a.method == "trimem" and parse_units(a.units) != DEFAULT_UNITS:
        raise InputError("--units does not apply to --method trimem (it shows facts, their turns and profiles)")
    enc = _bank_encoder(bank)
    z = enc.encode([q], is_query=True)
    from ..select.restrict import unit_mask

    if a.method != "trimem":
        from ..select.baselines import baseline_units
        from ..select.context import BankContext

        view = unit_view(bank, a.units)
        keep = unit_mask(view, a.where)
        units = baseline_units(a.method, BankContext.of(view), q, z[0], None, qp, keep=keep)
        return SelectedWorkspace.of(view, q, units, "none", False, keep=keep), {}
    from ..select.trimem.method import TriMemRankers, trimem_select

    from ..llm.base import LLMWork

    plan_llm = _plan_llm(a)
    rankers = TriMemRankers({bank.bank_id: bank})
    keep = unit_mask(rankers[bank.bank_id].view, a.where)
    try:
        with LLMWork(plan_llm) as work:
            (got,) = trimem_select(rankers, [(bank.bank_id, q)], z, qp, llm=plan_llm,
                                   encode=lambda xs: enc.encode(xs, is_query=True), masks=[keep])
    finally:
        if plan_llm is not None:
            plan_llm.close()
    return SelectedWorkspace.of(got.view, q, got.units, "none", False, keep=keep), {"plan": got.plan.to_dict(),
                                                                                     "llm": work.report()}


def _query_planned(a, q: str, cfg, qp, plan_llm):
    """``(workspace, extra JSON fields)`` of ``query --method trawmem --plan-llm``: planned TrawMem
    (``eval.planned``) over the one bank's unit view for ``--units``, on the engine ``query``
    uses without a plan, through the engine client."""
    from ..memory.core import served_engine
    from ..eval.planned import planner
    from ..llm.base import LLMWork

    bank = _query_bank(a)
    enc = _bank_encoder(bank)
    served = served_engine({bank.bank_id: bank}, cfg, head=_load_head(a.head), units=a.units)
    with LLMWork(plan_llm) as work:
        ws, sel = _select_one(served, bank, q, qp, enc, a.where, cfg, planner(
            llm=plan_llm, follow_up=a.follow_up, encode=lambda xs: enc.encode(xs, is_query=True)))
    return ws, {"plan": sel.planned.to_dict(), "llm": work.report()}


def _select_one(served, bank, q: str, qp, enc, where, cfg, planner=None, as_of=None):
    """``(workspace, selection)`` of ``q`` over a lone bank's served engine (``select.client``)."""
    from ..memory import SelectedWorkspace
    from ..select import client

    (sel,) = client.select(served, [client.Request(bank.bank_id, q, qp, where=where, as_of=as_of)],
                           encode=lambda xs: enc.encode(xs, is_query=True), planner=planner)
    return SelectedWorkspace.of(sel.bank, q, sel.units, cfg.headings, sel.dated, keep=sel.keep), sel


def cmd_query(a) -> int:
    """One question through the Memory core: the engine, picks and workspace of ``Memory.select``
    and of the server (a lone bank directory gets the same engine over that one bank); ``--method``
    trimem or a baseline through :func:`_query_ranked`, planned TrawMem (``--plan-llm``) through
    :func:`_query_planned`."""
    from ..memory import Memory
    from ..memory.core import served_engine
    from ..store import Collection, load_bank

    q = _check_question(a.question)
    _check_plan_flags(a)
    cfg, qp = _select_config(a)
    extra = {}
    p = Path(a.bank)
    if a.method != "trawmem":
        ws, extra = _query_ranked(a, q, qp)
    elif a.plan_llm:
        plan_llm = _plan_llm(a)
        try:
            ws, extra = _query_planned(a, q, cfg, qp, plan_llm)
        finally:
            plan_llm.close()
    elif (p / "meta.json").exists():
        bank = load_bank(p)
        eng = served_engine({bank.bank_id: bank}, cfg, head=_load_head(a.head), units=a.units)
        ws, _ = _select_one(eng, bank, q, qp, _bank_encoder(bank), a.where, cfg, as_of=a.as_of)
    else:
        head = _load_head(a.head)
        coll = Collection(p)
        coll.bank_path(_bank_id(a, coll))  # UnknownBank naming what the collection holds
        mem = Memory(p, method=cfg, head=head, only=[a.bank_id], create=False, embedding_cache=True, units=a.units)
        ws = mem.select(a.bank_id, q, params=qp, where=a.where, as_of=a.as_of)
    if a.json:
        print(json.dumps({"bank_id": ws.bank_id, "question": q, "units": ws.unit_ids, "tokens": ws.tokens,
                          "tokenizer": ws.tokenizer, "workspace": ws.text, **extra}, indent=1))
    else:
        print(ws.text)
        print(f"-- {plural(len(ws.units), 'unit')} in {plural(len(ws.threads), 'thread')}, {ws.tokens} tokens "
              f"({ws.tokenizer})")
        if extra.get("llm"):
            from ..llm.base import work_line

            print(f"-- {work_line(extra['llm']['totals'])}")
    return 0


def configure(q) -> None:
    q.describe("Select and print the workspace of one question from one bank.")
    q.add_argument("--bank", required=True, help="bank or collection directory")
    q.add_argument("--bank-id", help="bank within a collection (default: the only one; needed when it holds several)")
    q.add_argument("--question", required=True, help=f"the question (at most {MAX_QUESTION_CHARS} characters)")
    add_method(q)
    add_llm_options(q)
    add_query_params(q)
    q.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    add_head(q)
    add_affinity_weights(q)
    add_units(q)
    q.add_argument("--as-of", type=_as_of, metavar="DATE",
                   help="show the facts valid on DATE, superseded since or not, with --units ...,facts "
                        "(default: the current facts)")
    add_where(q, "select only among turns whose metadata passes this filter (docs/python-api.md, 'Metadata and "
                 "filters'), e.g. '{\"user_id\": \"u1\", \"importance\": {\"gte\": 3}}' (default: every turn)")
    q.add_argument("--json", action="store_true", help="print the workspace and its ids as JSON")
    q.set_defaults(fn=cmd_query)


def _as_of(text: str) -> str:
    """``--as-of``: a date the loaders read, as ISO ``YYYY-MM-DD`` (a date-time: its UTC instant)."""
    import argparse

    from ..data.dates import parse_date
    from ..store.facts import utc_text

    try:
        return utc_text(parse_date(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
