"""``trawmem query`` / ``eval`` / ``demo``: the selection side of the command line."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .errors import InputError

MAX_QUESTION_CHARS = 4000


def _select_config(a):
    from .select.config import SelectConfig

    base = SelectConfig.paper() if getattr(a, "paper", False) else SelectConfig()
    kw = {}
    if getattr(a, "budget", None) is not None:
        kw["budget"] = a.budget
    if getattr(a, "hops", None) is not None:
        kw["hops"] = a.hops
    if getattr(a, "ablation", None):
        kw["ablation"] = a.ablation
    return replace(base, **kw)


def _check_question(q: str) -> str:
    if not q or not q.strip():
        raise InputError("--question is empty")
    if len(q) > MAX_QUESTION_CHARS:
        raise InputError(f"--question is {len(q)} characters; the limit is {MAX_QUESTION_CHARS}")
    return q.strip()


def _load_head(path):
    if not path:
        return None
    from .head import load_head

    return load_head(path)


def cmd_query(a) -> int:
    from .encode import get_encoder
    from .select.context import BankContext
    from .select.reference import select_reference
    from .store import Collection, load_bank
    from .workspace import assemble

    q = _check_question(a.question)
    p = Path(a.bank)
    if (p / "meta.json").exists():
        bank = load_bank(p)
    else:
        coll = Collection(p)
        if a.bank_id is None:
            if len(coll) != 1:
                raise InputError(f"{p} holds {len(coll)} banks; name one with --bank-id ({', '.join(coll.bank_ids[:5])})")
            a.bank_id = coll.bank_ids[0]
        bank = coll.load(a.bank_id)
    from .config import BuildConfig

    enc = get_encoder(BuildConfig.from_dict(bank.build_config).encoder if bank.build_config else "minilm")
    if enc.id != bank.encoder_id:
        raise InputError(f"bank was encoded with {bank.encoder_id!r}, the configured encoder is {enc.id!r}")
    z = enc.encode([q], is_query=True)[0]
    cfg = _select_config(a)
    kw = {"head": _load_head(a.head)} if a.head else {}
    sel = select_reference(BankContext.of(bank), q, z, cfg, **kw)
    ws = assemble(bank, q, sel.units)
    if a.json:
        print(json.dumps({"bank_id": bank.bank_id, "question": q, "units": ws.unit_ids, "tokens": ws.n_tokens,
                          "tokenizer": ws.tokenizer, "workspace": ws.render()}, indent=1))
    else:
        print(ws.render())
        print(f"-- {len(ws.unit_ids)} units in {len(ws.blocks)} threads, {ws.n_tokens} tokens ({ws.tokenizer})")
    return 0


def cmd_eval(a) -> int:
    from .eval.retrieval import run_eval

    cfg = _select_config(a)
    head = _load_head(a.head)
    cats = tuple(int(c) for c in a.categories.split(","))
    res = run_eval(a.data, a.method, cfg, categories=cats, engine=a.engine, head=head,
                   bank_cache=a.banks, keep_records=True)
    if a.answer_llm or a.judge_llm:
        from .eval.end_to_end import add_answer_metrics

        add_answer_metrics(res, a)
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    m = res["macro"]
    print(f"{a.method} B={cfg.budget} H={cfg.hops} ablation={cfg.ablation}: macro evidence recall "
          f"{m['evidence_recall']:.3f}, all-evidence hit {m['all_evidence_hit']:.3f}, "
          f"multi-hop hit {res['per_category'].get('1', {}).get('all_evidence_hit', float('nan')):.3f}, "
          f"context tokens {m['context_tokens']:.0f} over {res['n_questions']} questions -> {out}")
    return 0


def cmd_demo(a) -> int:
    """Build the bundled sample into a collection and answer its sample questions."""
    from .build import build_banks
    from .data import load_conversations, sample_path
    from .encode import get_encoder
    from .select.config import SelectConfig
    from .select.context import BankContext
    from .select.reference import select_reference
    from .store import Collection
    from .workspace import assemble

    convs = load_conversations(sample_path())
    banks, st = build_banks(convs, progress=False)
    out = Path(a.out)
    coll = Collection(out, create=True)
    for b in banks:
        coll.put(b)
    bank = coll.load(banks[0].bank_id)
    print(f"built {out}: {bank.n_units} units in {bank.n_threads} threads "
          f"(encode {st['encode_units_s'] + st['encode_heads_s']:.2f}s)\n")
    qs = json.loads((sample_path().parent / "sample_questions.json").read_text())
    enc = get_encoder()
    Z = enc.encode([q["question"] for q in qs], is_query=True)
    ctx = BankContext.of(bank)
    cfg = SelectConfig(budget=a.budget)
    hits = []
    for q, z in zip(qs, Z):
        ws = assemble(bank, q["question"], select_reference(ctx, q["question"], z, cfg).units)
        got = len(set(q["evidence"]) & set(ws.unit_ids)) / len(q["evidence"])
        hits.append(got)
        print(f"Q: {q['question']}\n{ws.render()}-- evidence recall {got:.2f}, {ws.n_tokens} tokens\n")
    print(f"mean evidence recall over {len(qs)} sample questions at B={a.budget}: {sum(hits) / len(hits):.2f}")
    return 0


def add_commands(sub) -> None:
    from .select.config import ABLATIONS

    q = sub.add_parser("query", help="print the workspace for one question")
    q.add_argument("--bank", required=True, help="bank or collection directory")
    q.add_argument("--bank-id", help="bank within a collection (needed when it holds several)")
    q.add_argument("--question", required=True)
    q.add_argument("--budget", type=int)
    q.add_argument("--hops", type=int)
    q.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    q.add_argument("--head", help="learned role head (safetensors)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(fn=cmd_query)

    e = sub.add_parser("eval", help="retrieval (and optionally answer) quality on LoCoMo-layout data")
    e.add_argument("--data", required=True)
    e.add_argument("--method", choices=["trawmem", "cosine", "bm25", "hybrid", "full"], default="trawmem")
    e.add_argument("--budget", type=int)
    e.add_argument("--hops", type=int)
    e.add_argument("--ablation", choices=list(ABLATIONS))
    e.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    e.add_argument("--engine", choices=["reference", "batched"], default="reference")
    e.add_argument("--head", help="learned role head (safetensors)")
    e.add_argument("--categories", default="1,2,3,4")
    e.add_argument("--banks", help="bank cache directory (default: under ~/.cache/trawmem_gpu)")
    e.add_argument("--answer-llm", help="http://HOST:PORT/v1[@MODEL] or vllm:MODEL_PATH")
    e.add_argument("--judge-llm", help="http://HOST:PORT/v1[@MODEL] or vllm:MODEL_PATH")
    e.add_argument("--output", required=True)
    e.set_defaults(fn=cmd_eval)

    d = sub.add_parser("demo", help="build the bundled sample conversation and show workspaces")
    d.add_argument("--out", default="trawmem-demo")
    d.add_argument("--budget", type=int, default=8)
    d.set_defaults(fn=cmd_demo)
