"""``trawmem query`` / ``eval`` / ``demo``: the selection side of the command line."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from .cli_args import add_ablation, add_affinity_weights, add_dayfirst, add_engine, add_head, add_llm_options, \
    add_method, add_token_budget, add_units, banks_cache_dir, budget_int, categories, hops_int, nonneg_int, positive_int
from .data.types import MAX_QUESTION_CHARS
from .errors import InputError, name_list, plural


def _select_config(a):
    """``(SelectConfig, QueryParams)``: the method and what every question asks for, from the flags."""
    from .select.config import PAPER_HOPS, SelectConfig
    from .select.params import FIELDS, merge_params

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
        from .head.relevance import load_weights

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


def _plan_llm(a):
    """The planning LLM of TriMem or planned TrawMem from ``--plan-llm`` (checked, cached), or None."""
    _check_plan_flags(a)
    spec = getattr(a, "plan_llm", None)
    if not spec:
        return None
    from .llm_factory import llm_from_args, llm_options

    return llm_from_args(spec, check=True, **llm_options(a))


def _load_head(path):
    if not path:
        return None
    from .head import load_head

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
    from .store import Collection, load_bank

    p = Path(a.bank)
    if (p / "meta.json").exists():
        return load_bank(p)
    coll = Collection(p)
    return coll.load(_bank_id(a, coll))


def _bank_encoder(bank):
    """The query encoder of ``bank``'s build config (MiniLM without one), checked against the bank's."""
    from .config import BuildConfig
    from .encode import get_encoder

    enc = get_encoder(BuildConfig.from_dict(bank.build_config).encoder if bank.build_config else "minilm")
    if enc.id != bank.encoder_id:
        raise InputError(f"bank was encoded with {bank.encoder_id!r}, the configured encoder is {enc.id!r}")
    return enc


def _query_ranked(a, q: str, qp):
    """``(workspace, extra JSON fields)`` of ``query --method`` trimem or a baseline (TrawMem has
    its own path): TriMem over the bank's facts (planned with ``--plan-llm``), a baseline over its
    unit view for ``--units``."""
    from .facts.view import DEFAULT_UNITS, parse_units, unit_view
    from .memory import SelectedWorkspace

    bank = _query_bank(a)
    if a.method == "trimem" and parse_units(a.units) != DEFAULT_UNITS:
        raise InputError("--units does not apply to --method trimem (it shows facts, their turns and profiles)")
    enc = _bank_encoder(bank)
    z = enc.encode([q], is_query=True)
    if a.method != "trimem":
        from .select.baselines import baseline_units
        from .select.context import BankContext

        view = unit_view(bank, a.units)
        units = baseline_units(a.method, BankContext.of(view), q, z[0], None, qp)
        return SelectedWorkspace.of(view, q, units, "none", False), {}
    from .trimem.method import TriMemRankers, trimem_select

    plan_llm = _plan_llm(a)
    try:
        (got,) = trimem_select(TriMemRankers({bank.bank_id: bank}), [(bank.bank_id, q)], z, qp, llm=plan_llm,
                               encode=lambda xs: enc.encode(xs, is_query=True))
    finally:
        if plan_llm is not None:
            plan_llm.close()
    return SelectedWorkspace.of(got.view, q, got.units, "none", False), {"plan": got.plan.to_dict()}


def _query_planned(a, q: str, cfg, qp, plan_llm):
    """``(workspace, extra JSON fields)`` of ``query --method trawmem --plan-llm``: planned TrawMem
    (``select.planned``) over the one bank's unit view for ``--units``, on the engine ``query``
    uses without a plan."""
    from .memory import SelectedWorkspace
    from .memory.core import served_engine
    from .select.planned import planned_select

    bank = _query_bank(a)
    enc = _bank_encoder(bank)
    served = served_engine({bank.bank_id: bank}, cfg, head=_load_head(a.head), units=a.units)
    z = enc.encode([q], is_query=True)
    (got,) = planned_select(served.engine, [(bank.bank_id, q)], z, qp, llm=plan_llm, follow_up=a.follow_up,
                            encode=lambda xs: enc.encode(xs, is_query=True))
    ws = SelectedWorkspace.of(served.bank(bank.bank_id), q, got.units, cfg.headings, False)
    return ws, {"plan": got.to_dict()}


def cmd_query(a) -> int:
    """One question through the Memory core: the engine, picks and workspace of ``Memory.select``
    and of the server (a lone bank directory gets the same engine over that one bank); ``--method``
    trimem or a baseline through :func:`_query_ranked`, planned TrawMem (``--plan-llm``) through
    :func:`_query_planned`."""
    from .memory import Memory, SelectedWorkspace
    from .memory.core import pick, served_engine
    from .store import Collection, load_bank

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
        head = _load_head(a.head)
        bank = load_bank(p)
        enc = _bank_encoder(bank)
        z = enc.encode([q], is_query=True)
        picks, banks, used = pick(served_engine({bank.bank_id: bank}, cfg, head=head, units=a.units),
                                  [bank.bank_id], [q], z, [None], [qp])
        ws = SelectedWorkspace.of(banks[0], q, picks[0], cfg.headings, used)
    else:
        head = _load_head(a.head)
        coll = Collection(p)
        coll.bank_path(_bank_id(a, coll))  # UnknownBank naming what the collection holds
        mem = Memory(p, method=cfg, head=head, only=[a.bank_id], create=False, embedding_cache=True, units=a.units)
        ws = mem.select(a.bank_id, q, params=qp)
    if a.json:
        print(json.dumps({"bank_id": ws.bank_id, "question": q, "units": ws.unit_ids, "tokens": ws.tokens,
                          "tokenizer": ws.tokenizer, "workspace": ws.text, **extra}, indent=1))
    else:
        print(ws.text)
        print(f"-- {plural(len(ws.units), 'unit')} in {plural(len(ws.threads), 'thread')}, {ws.tokens} tokens "
              f"({ws.tokenizer})")
    return 0


def cmd_eval(a) -> int:
    from .eval.end_to_end import add_answer_metrics, close_backends, failed_requests, open_backends
    from .eval.retrieval import run_eval

    cfg, qp = _select_config(a)
    head = _load_head(a.head)
    answer = judge = None
    if a.answer_llm or a.judge_llm:  # checked first: a wrong URL, key or model stops here, before retrieval
        answer, judge = open_backends(a)
    plan = None
    try:
        plan = _plan_llm(a)
        res = run_eval(a.data, a.method, cfg, categories=a.categories, engine=a.engine, head=head,
                       bank_cache=a.banks, keep_records=True, dayfirst=a.dayfirst, params=qp, units=a.units,
                       facts=a.facts, plan_llm=plan, follow_up=a.follow_up)
        if answer is not None:
            add_answer_metrics(res, a, answer_backend=answer, judge_backend=judge)
    finally:
        close_backends(answer, judge, plan)
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    m = res["macro"]
    mh = res["per_category"].get("1", {}).get("all_evidence_hit")
    size = f"B={qp.budget}" if qp.token_budget is None else \
        f"T={qp.token_budget}" + (f" B={qp.budget}" if qp.budget is not None else "")
    print(f"{a.method} {size} H={qp.hops} ablation={cfg.ablation}: macro evidence recall "
          f"{m['evidence_recall']:.3f}, all-evidence hit {m['all_evidence_hit']:.3f}, "
          f"multi-hop hit {'n/a' if mh is None else f'{mh:.3f}'}, context tokens {m['context_tokens']:.0f} over "
          f"{plural(res['n_questions'], 'question')} -> {out}")
    if "evidence_recall_cited" in m:
        what = "trimem" if a.method == "trimem" else f"units {','.join(a.units)}"
        print(f"{what}: macro evidence recall with citations {m['evidence_recall_cited']:.3f}, "
              f"per workspace {m['n_turns']:.1f} turns, {m['n_facts']:.1f} facts, {m['n_profiles']:.1f} profile "
              f"sections")
    failed = failed_requests(res)
    if failed > a.allow_failures:
        print(f"trawmem eval: error: {plural(failed, 'LLM request')} failed (more than --allow-failures "
              f"{a.allow_failures}); they are scored wrong in {out}. Rerun the same command to retry only them "
              f"(answers that succeeded come from the cache), or raise --allow-failures", file=sys.stderr)
        return 1
    return 0


def cmd_demo(a) -> int:
    """Build the bundled sample into a collection and answer its sample questions."""
    from .construct import build_banks
    from .data import load_conversations, sample_path
    from .encode import get_encoder
    from .select.config import SelectConfig
    from .select.context import BankContext
    from .select.params import merge_params
    from .select.reference import select_reference
    from .store import Collection
    from .workspace import assemble

    out = Path(a.out)
    coll = Collection(out, create=True)
    convs = load_conversations(sample_path())
    banks, st = build_banks(convs, progress=False)
    coll.put_many(banks)
    bank = coll.load(banks[0].bank_id)
    print(f"built {out}: {plural(bank.n_units, 'unit')} in {plural(bank.n_threads, 'thread')} "
          f"(encode {st['encode_units_s'] + st['encode_heads_s']:.2f}s)\n")
    qs = json.loads((sample_path().parent / "sample_questions.json").read_text())
    enc = get_encoder()
    Z = enc.encode([q["question"] for q in qs], is_query=True)
    ctx = BankContext.of(bank)
    cfg, qp = SelectConfig(), merge_params({"budget": a.budget})
    hits = []
    for q, z in zip(qs, Z):
        ws = assemble(bank, q["question"], select_reference(ctx, q["question"], z, cfg, qp).units, cfg.headings)
        got = len(set(q["evidence"]) & set(ws.unit_ids)) / len(q["evidence"])
        hits.append(got)
        print(f"Q: {q['question']}\n{ws.render()}-- evidence recall {got:.2f}, {ws.n_tokens} tokens\n")
    print(f"mean evidence recall over {len(qs)} sample questions at B={a.budget}: {sum(hits) / len(hits):.2f}")
    return 0


def _budget_help() -> tuple[str, str]:
    from .select.params import QueryParams

    d0 = QueryParams()
    return (f"workspace budget B: units selected per question (default: {d0.budget}; with --token-budget: "
            "a cap on the units, none unless given)",
            f"propagation hops H over the thread graph (default: {d0.hops})")


def configure_query(q) -> None:
    budget_help, hops_help = _budget_help()
    q.describe("Select and print the workspace of one question from one bank.")
    q.add_argument("--bank", required=True, help="bank or collection directory")
    q.add_argument("--bank-id", help="bank within a collection (default: the only one; needed when it holds several)")
    q.add_argument("--question", required=True, help=f"the question (at most {MAX_QUESTION_CHARS} characters)")
    add_method(q)
    add_llm_options(q)
    q.add_argument("--budget", type=budget_int, help=budget_help)
    add_token_budget(q)
    q.add_argument("--hops", type=hops_int, help=hops_help)
    q.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    add_head(q)
    add_affinity_weights(q)
    add_units(q)
    q.add_argument("--json", action="store_true", help="print the workspace and its ids as JSON")
    q.set_defaults(fn=cmd_query)


def configure_eval(e) -> None:
    from .llm.spec import SPEC_HELP

    budget_help, hops_help = _budget_help()
    e.describe("Select for every question with gold evidence and score evidence recall, "
               "all-evidence hit and context tokens per category; with --answer-llm also "
               "answer F1 / BLEU-1 and, with --judge-llm, LLM-judge accuracy. Exit status 1 "
               "when more LLM requests failed than --allow-failures (results are still "
               "written; a rerun retries only the failed requests).")
    e.add_argument("--data", required=True, help="LoCoMo-layout JSON with questions and evidence")
    add_dayfirst(e)
    add_method(e)
    e.add_argument("--budget", type=budget_int, help=budget_help)
    add_token_budget(e, fill=True)
    e.add_argument("--hops", type=hops_int, help=hops_help)
    add_ablation(e)
    e.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    add_engine(e)
    add_head(e)
    add_affinity_weights(e)
    add_units(e, facts=True)
    e.add_argument("--categories", type=categories, default="1,2,3,4", metavar="C,C,...",
                   help="LoCoMo question categories to score")
    e.add_argument("--banks", help="bank directory: built into when new or empty, else used only if its banks "
                                   f"match the data (default: an automatic cache under {banks_cache_dir()})")
    e.add_argument("--answer-llm", help=f"answer model: {SPEC_HELP} (default: none, retrieval metrics only)")
    e.add_argument("--judge-llm", help=f"judge model: {SPEC_HELP} (default: none, no judge accuracy)")
    add_llm_options(e)
    e.add_argument("--allow-failures", type=nonneg_int, default=0, metavar="N",
                   help="LLM requests that may fail (after retries) before the exit status turns 1")
    e.add_argument("--output", required=True, help="result JSON to write")
    e.set_defaults(fn=cmd_eval)


def configure_demo(d) -> None:
    d.describe("Build the bundled sample conversation into a collection, then print the workspace and "
               "evidence recall for each of its sample questions.")
    d.add_argument("--out", default="trawmem-demo", help="collection directory to build the sample into")
    d.add_argument("--budget", type=positive_int, default=8, help="workspace budget B")
    d.set_defaults(fn=cmd_demo)
