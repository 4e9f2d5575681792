"""How close the additive token costs (``select.workspace.token_costs``) come to the real rendering.

For every LoCoMo dev bank, random unit sets of 1-39 units (300 per bank and mode), with heads
(TrawMem's workspaces) and without (the baselines'): the additive cost minus the rendered
workspace's token count (cl100k_base). The costs are an upper bound by construction
(``TokenCosts``); this measures how tight it is, and how long counting the costs takes.

    python -m benchmarks run token_costs [--data PATH] [--sets 300] [--out FILE]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import time

from . import harness


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--sets", type=int, default=300, help="random unit sets per bank and mode")
    ap.add_argument("--out", help="result file (default: token_costs.json in the results folder)")
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    out = harness.out_file(args.out, "token_costs.json")

    import numpy as np

    from trawmem_gpu.eval.retrieval import banks_for
    from trawmem_gpu.tokens import TOKENIZER_NAME
    from trawmem_gpu.select.workspace import assemble, token_costs

    _, banks, _ = banks_for(args.data, progress=False)
    rng = np.random.default_rng(0)
    res = {"tokenizer": TOKENIZER_NAME, "banks": len(banks), "units": int(sum(b.n_units for b in banks)),
           "sets_per_bank": args.sets}
    for heads in ("gist", "date", "none"):
        t0 = time.perf_counter()
        costs = [token_costs(b, heads) for b in banks]
        secs = time.perf_counter() - t0
        over = []
        for b, c in zip(banks, costs):
            for _ in range(args.sets):
                S = rng.choice(b.n_units, size=int(rng.integers(1, 40)), replace=False)
                over.append(c.cost(S, b.unit_thread) - assemble(b, "q", list(S), heads).n_tokens)
        o = np.array(over)
        key = {"gist": "with_heads", "date": "date_headings", "none": "without_heads"}[heads]
        res[key] = {"sets": len(o), "over_mean": round(float(o.mean()), 4), "over_min": int(o.min()),
                    "over_max": int(o.max()), "under_count": int((o < 0).sum()),
                    "bounded_banks": sum(c.bounded for c in costs), "count_seconds_all_banks": round(secs, 3)}
        print(f"{key}: additive - real tokens over {len(o)} sets: mean {o.mean():.3f}, min {o.min()}, max {o.max()}, "
              f"{(o < 0).sum()} under; costs of {len(banks)} banks counted in {secs:.2f}s")
    print(f"-> {harness.save(out.stem, res, out_dir=out.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
