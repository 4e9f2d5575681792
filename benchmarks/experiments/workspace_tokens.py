"""Context tokens of the same workspaces in the previous rendering (68a5f04) and the current one.

Selection is unchanged; only the thread heading changed, from ``## [08 May 2023] A & B: A: <quote>``
to ``## 8 May 2023 — A: <quote>`` (no speaker list, no zero-padded bracketed date), and texts are
sanitized (see ``trawmem_gpu/select/workspace.py``). For every category 1-4 dev question, TrawMem (with
heads) and cosine top-B (no heads) workspaces are rendered both ways and counted with
``cl100k_base``; prints and saves the means and the median per-question ratio.

    python -m benchmarks.experiments.workspace_tokens [--data PATH] [--budget 16] [--out FILE]
"""
from __future__ import annotations

import argparse
import statistics

from .. import harness


def old_render(ws) -> str:
    """The rendering of commit 68a5f04, kept here only for this comparison."""
    out = []
    for b in ws.blocks:
        date = b.units[0].time.strftime("%d %B %Y") if b.units[0].time else b.units[0].timestamp
        if b.head is not None:
            head = b.head
            if head.startswith("[") and ": " in head:
                prefix, quote = head.split(": ", 1)
                quote = quote.removesuffix(" ...").strip()
                if any(quote and f"{t.speaker}: {t.text}".startswith(quote) for t in b.units):
                    head = prefix
            out.append(f"## {head}" if head.startswith(f"[{date}]") else f"## [{date}] {head}")
        for t in b.units:
            s = f"[{t.turn_id}] {t.speaker}: {t.text}" if b.head is not None else \
                f"[{t.turn_id}] ({date}) {t.speaker}: {t.text}"
            if t.caption:
                s += f" [shares an image: {t.caption}]"
            out.append(s)
        out.append("")
    return "\n".join(out).strip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--out", help="result file (default: workspace_tokens.json in results/archive)")
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    out = harness.out_file(args.out, "workspace_tokens.json", harness.ARCHIVE)

    from trawmem_gpu.eval.retrieval import banks_for, run_eval
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.tokens import TOKENIZER_NAME, count_tokens
    from trawmem_gpu.select.workspace import assemble, headings_for

    convs, banks, _ = banks_for(args.data, progress=False)
    bank_of = {b.bank_id: b for b in banks}
    res = {"tokenizer": TOKENIZER_NAME, "budget": args.budget}
    for method in ("trawmem", "cosine"):
        r = run_eval(args.data, method, SelectConfig(), progress=False, banks_and_convs=(convs, banks),
                     params=QueryParams(budget=args.budget))
        new, old = [], []
        for rec in r["records"]:
            b = bank_of[rec["bank_id"]]
            idx = b.index_of()
            ws = assemble(b, "q", [idx[t] for t in rec["selected"]], headings_for(method, SelectConfig()))
            new.append(count_tokens(ws.render()))
            old.append(count_tokens(old_render(ws)))
        res[method] = {"questions": len(new), "mean_tokens_previous": round(statistics.mean(old), 1),
                       "mean_tokens_now": round(statistics.mean(new), 1),
                       "median_ratio_now_over_previous": round(statistics.median(n / o for n, o in zip(new, old)), 4),
                       "macro_context_tokens_now": round(r["macro"]["context_tokens"], 1),
                       "macro_evidence_recall": round(r["macro"]["evidence_recall"], 4)}
        m = res[method]
        print(f"{method}: {m['questions']} questions, mean tokens {m['mean_tokens_previous']} -> {m['mean_tokens_now']}"
              f" (median ratio {m['median_ratio_now_over_previous']}), macro context tokens "
              f"{m['macro_context_tokens_now']}, macro evidence recall {m['macro_evidence_recall']}")
    print(f"-> {harness.save(out.stem, res, out_dir=out.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
