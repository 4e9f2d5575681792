"""The ``trawmem`` command: build, info, query, eval, demo."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from .errors import TrawmemError


def _overrides(a) -> dict:
    return {k: getattr(a, k) for k in ("segmentation", "heads", "encoder", "fixed_size")
            if getattr(a, k, None) is not None}


def _build_config(a, base: dict | None = None):
    """Config from the flags given, on top of ``base`` (a stored bank's config) or the defaults."""
    from .config import BuildConfig

    return BuildConfig.from_dict({**(base or {}), **_overrides(a)})


def cmd_build(a) -> int:
    from .build import build_banks, update_bank
    from .data import load_conversations
    from .encode import get_encoder
    from .llm_factory import llm_from_args
    from .store import Collection

    cfg = _build_config(a)
    convs = load_conversations(a.input, a.format)
    coll = Collection(a.out, create=True)
    enc = get_encoder(cfg.encoder, cache=not a.no_cache)
    llm = llm_from_args(a.llm) if (cfg.segmentation == "llm" or cfg.heads == "llm") else None
    fresh, updated = [], 0
    for c in convs:
        if c.bank_id in coll and a.update:
            old = coll.load(c.bank_id)
            ids = [t.turn_id for t in old.turns]
            if [t.turn_id for t in c.turns[:len(ids)]] != ids:
                raise TrawmemError(f"--update: input for bank {c.bank_id!r} does not start with the bank's "
                                   f"{len(ids)} stored turns; rebuild it without --update")
            # An update continues with the bank's own build config unless flags override it.
            bank, st = update_bank(old, c.turns[len(ids):], _build_config(a, old.build_config), enc, llm)
            coll.put(bank)
            updated += 1
            print(f"updated {c.bank_id}: +{st['n_new_units']} units, {bank.n_threads} threads")
        else:
            fresh.append(c)
    if fresh:
        banks, st = build_banks(fresh, cfg, enc, llm, progress=not a.quiet)
        for b in banks:
            coll.put(b)
        print(f"built {len(banks)} banks, {st['n_units']} units in {a.out} "
              f"(encode {st['encode_units_s'] + st['encode_heads_s']:.1f}s, segment {st['segment_s']:.2f}s, "
              f"graph {st['graph_s']:.2f}s)")
    if updated:
        print(f"updated {updated} banks")
    return 0


def cmd_info(a) -> int:
    from .store import Collection, load_bank

    p = Path(a.dir)
    banks = [load_bank(p)] if (p / "meta.json").exists() else Collection(p).load_all()
    if not banks:
        raise TrawmemError(f"{p}: the collection holds no banks")
    lens = np.concatenate([np.diff(b.thread_offsets) for b in banks])
    info = {
        "path": str(p), "banks": len(banks), "threads": int(sum(b.n_threads for b in banks)),
        "units": int(sum(b.n_units for b in banks)), "encoder": banks[0].encoder_id,
        "thread_length": {"mean": round(float(lens.mean()), 2), "median": float(np.median(lens)),
                          "min": int(lens.min()), "max": int(lens.max()), "p90": float(np.percentile(lens, 90))},
        "edges": {"adjacent": int(sum((b.edge_kind == 0).sum() for b in banks) // 2),
                  "semantic": int(sum((b.edge_kind == 1).sum() for b in banks) // 2)},
        "per_bank": [{"bank_id": b.bank_id, "units": b.n_units, "threads": b.n_threads} for b in banks],
    }
    if a.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{info['path']}: {info['banks']} banks, {info['threads']} threads, {info['units']} units "
          f"(encoder {info['encoder']})")
    tl = info["thread_length"]
    print(f"thread length: mean {tl['mean']}, median {tl['median']}, min {tl['min']}, p90 {tl['p90']}, "
          f"max {tl['max']}")
    print(f"edges: {info['edges']['adjacent']} adjacent, {info['edges']['semantic']} semantic")
    for r in info["per_bank"]:
        print(f"  {r['bank_id']}: {r['units']} units, {r['threads']} threads")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trawmem", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="build one bank per conversation into a collection")
    b.add_argument("--input", required=True, help="LoCoMo JSON or JSONL history")
    b.add_argument("--out", required=True, help="collection directory")
    b.add_argument("--format", choices=["auto", "locomo", "jsonl"], default="auto")
    b.add_argument("--segmentation", choices=["embedding", "fixed", "llm"])
    b.add_argument("--heads", choices=["extractive", "llm"])
    b.add_argument("--fixed-size", type=int, dest="fixed_size")
    b.add_argument("--encoder", help="'minilm' (default) or 'hf:/local/model/dir'")
    b.add_argument("--llm", help="LLM for --segmentation/--heads llm: http://HOST:PORT/v1[@MODEL] or vllm:PATH")
    b.add_argument("--update", action="store_true", help="append new turns to existing banks incrementally")
    b.add_argument("--no-cache", action="store_true", help="do not use the on-disk embedding cache")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=cmd_build)

    i = sub.add_parser("info", help="bank, thread and unit counts of a collection or bank")
    i.add_argument("dir")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_info)

    from . import cli_select

    cli_select.add_commands(sub)
    from .head.cli import add_commands as add_head_commands; add_head_commands(sub)  # noqa: E702
    from .serve.cli import add_commands as add_serve_commands; add_serve_commands(sub)  # noqa: E702
    return p


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except (TrawmemError, KeyError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"trawmem {a.cmd}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
