"""``trawmem demo``: the bundled sample conversation built, and a workspace for each of its questions."""
from __future__ import annotations

from pathlib import Path

from .args import positive_int
from ..errors import loads_json, plural


def cmd_demo(a) -> int:
    """Build the bundled sample into a collection and answer its sample questions."""
    from ..ingest import build_banks
    from ..data import load_conversations, sample_path
    from ..encode import get_encoder
    from ..select.config import SelectConfig
    from ..select.context import BankContext
    from ..select.params import merge_params
    from ..select.reference import select_reference
    from ..store import Collection
    from ..select.workspace import assemble

    out = Path(a.out)
    coll = Collection(out, create=True)
    convs = load_conversations(sample_path())
    banks, st = build_banks(convs, progress=False)
    coll.put_many(banks)
    bank = coll.load(banks[0].bank_id)
    print(f"built {out}: {plural(bank.n_units, 'unit')} in {plural(bank.n_threads, 'thread')} "
          f"(encode {st['encode_units_s'] + st['encode_heads_s']:.2f}s)\n")
    qs = loads_json((sample_path().parent / "sample_questions.json").read_text())
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


def configure(d) -> None:
    d.describe("Build the bundled sample conversation into a collection, then print the workspace and "
               "evidence recall for each of its sample questions.")
    d.add_argument("--out", default="trawmem-demo", help="collection directory to build the sample into")
    d.add_argument("--budget", type=positive_int, default=8, help="workspace budget B")
    d.set_defaults(fn=cmd_demo)
