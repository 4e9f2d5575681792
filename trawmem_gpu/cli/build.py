"""The ``trawmem`` command line: a table of commands, each configured and imported when it runs.

``COMMANDS`` names every command with its one-line summary and the function (``module:function``)
that adds its options. ``trawmem --help`` reads only the table, so it imports no model code;
``trawmem eval ...`` imports the eval command's module, and that module imports torch, numba or
transformers inside the command function, when the command runs (pip's layout: the parser
learns a command's options only when that command is asked for).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from .cli_args import Parser, add_dayfirst, add_llm_options, flags_for_fields, positive_int
from .errors import InputError, TrawmemError, plural

#: command -> ("module:function" adding its options to its parser, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("trawmem_gpu.cli:configure_build",
              "build one memory bank per conversation into a collection (or --update it)"),
    "info": ("trawmem_gpu.cli:configure_info", "bank, thread and unit counts of a collection or bank"),
    "repair-index": ("trawmem_gpu.cli:configure_repair_index",
                     "rebuild a collection's index (collection.json) from its banks' metadata"),
    "query": ("trawmem_gpu.cli_select:configure_query", "print the workspace for one question"),
    "forget": ("trawmem_gpu.cli_forget:configure_forget",
               "forget turns of a bank, or a whole bank, in its files and every cache"),
    "eval": ("trawmem_gpu.cli_select:configure_eval",
             "retrieval (and optionally answer) quality on LoCoMo-layout data"),
    "demo": ("trawmem_gpu.cli_select:configure_demo", "build the bundled sample conversation and show workspaces"),
    "score": ("trawmem_gpu.cli_score:configure_score",
              "offline scoring: workspaces JSONL for a batch of questions (resumable)"),
    "sweep": ("trawmem_gpu.cli_sweep:configure_sweep",
              "quality, context tokens and latency over a hops x budget grid, with the Pareto-optimal cells"),
    "train-head": ("trawmem_gpu.head.cli:configure_train_head",
                   "train the learned role head (A, M(delta), weights) from gold evidence"),
    "train-affinity": ("trawmem_gpu.head.cli:configure_train_affinity",
                       "fit the learned affinity (--affinity-weights) from gold evidence labels"),
    "evolve-prompts": ("trawmem_gpu.trimem.cli:configure_evolve",
                       "evolve TriMem's extraction and profile prompts on a dev split (TextGrad-style, resumable)"),
    "serve": ("trawmem_gpu.serve.cli:configure_serve",
              "HTTP selection service with dynamic batching and API keys (extra: serve)"),
    "serve-key": ("trawmem_gpu.serve.cli:configure_serve_key",
                  "create an API key for `trawmem serve` (prints it once)"),
    "mcp": ("trawmem_gpu.cli_mcp:configure_mcp",
            "Model Context Protocol server (stdio or streamable HTTP) with add, recall, forget tools (extra: mcp)"),
}


def _overrides(a) -> dict:
    return {k: getattr(a, k) for k in ("segmentation", "heads", "encoder", "fixed_size")
            if getattr(a, k, None) is not None}


def _build_config(a, base: dict | None = None):
    """Config from the flags given, on top of ``base`` (a stored bank's config) or the defaults."""
    from .ingest.config import BuildConfig

    return BuildConfig.from_dict({**(base or {}), **_overrides(a)})


def _llm_summary(stats: dict, n_sessions: int, n_threads: int) -> str | None:
    seg, head = int(stats.get("llm_segment_fallbacks", 0)), int(stats.get("llm_head_fallbacks", 0))
    parts = ([f"{seg} of {n_sessions} sessions fell back to embedding segmentation"] if seg else []) + \
            ([f"{head} of {n_threads} heads fell back to extractive"] if head else [])
    return "LLM: " + ", ".join(parts) + " (malformed or failed replies)" if parts else None


def _facts_summary(st: dict) -> str:
    """One line on the facts a build added and what was repaired or dropped on the way."""
    extra = [f"{k.replace('_', ' ')} {v}" for k, v in st.items() if k != "facts_added" and k != "facts" and v]
    return f"facts: {plural(st.get('facts_added', 0), 'fact')} added" + (f" ({', '.join(extra)})" if extra else "")


def _appender(a, c, out: dict, enc, llm, prompts, pstats: list):
    """``Collection.update``'s function for an ``--update`` of ``c``'s bank: the bank with the new
    turns of ``c`` appended (and their facts and profile sections), None when nothing is new; the
    run's counts go into ``out``."""
    from .ingest import update_bank
    from .ingest.history import new_turns
    from .ingest.layers.facts import attach_facts, check_locomo_update
    from .ingest.layers.profiles import attach_profiles

    def append(old):
        turns = new_turns(old, c, dayfirst=a.dayfirst)
        source = a.facts or old.layer_sources.get("facts", "none")  # the bank's own, unless given
        if source == "locomo":  # the old observations must be the bank's facts, new turns or not
            check_locomo_update(old, a.input, dayfirst=a.dayfirst)
        if not turns:
            return None
        # An update continues with the bank's own build config unless flags override it.
        bank, out["stats"] = update_bank(old, turns, _build_config(a, old.build_config), enc, llm)
        (bank,), out["facts"] = attach_facts([bank], source, enc, input_path=a.input, llm=llm, dayfirst=a.dayfirst,
                                             new_turns={c.bank_id: turns}, prompts=prompts)
        if (a.profiles or old.layer_sources.get("profiles", "none")) == "llm":  # new facts' sections
            bank, pst = attach_profiles(bank, llm, enc, prompts=prompts,
                                        new_fact_ids=[f.fact_id for f in bank.facts[len(old.facts):]])
            pstats.append(pst)
        return bank
    return append


def cmd_build(a) -> int:
    from .ingest import build_banks
    from .data import load_conversations
    from .ingest.layers.facts import attach_facts
    from .encode import get_encoder
    from .llm.factory import llm_from_args, llm_options
    from .store import Collection

    cfg = _build_config(a)
    convs = load_conversations(a.input, a.format, dayfirst=a.dayfirst)
    coll = Collection(a.out, create=True)
    skipped = sum(c.skipped_empty for c in convs)
    if skipped:
        print(f"skipped {plural(skipped, 'turn')} with empty text and no caption")
    if a.profiles == "llm" and a.facts in (None, "none") and not a.update:
        raise InputError("--profiles llm builds profiles from facts: give --facts locomo or --facts llm")
    prompts = None
    if a.prompts:
        from .ingest.layers.prompts import load_prompt_set

        prompts = load_prompt_set(a.prompts)
    from .ingest.layers.profiles import attach_profiles, profiles_summary

    pstats = []
    llm = llm_from_args(a.llm, check=True, **llm_options(a)) \
        if (cfg.segmentation == "llm" or cfg.heads == "llm" or "llm" in (a.facts, a.profiles)
            or (a.update and a.llm)) else None
    try:
        enc = get_encoder(cfg.encoder, cache=not a.no_cache)
        fresh, updated, replaced = [], 0, 0
        for c in convs:
            if a.update and c.bank_id in coll:
                out = {}
                bank = coll.update(c.bank_id, _appender(a, c, out, enc, llm, prompts, pstats))
                if bank is None:
                    print(f"{c.bank_id}: nothing new (all {plural(len(c.turns), 'turn')} of the input are stored)")
                    continue
                updated += 1
                print(f"updated {c.bank_id}: +{plural(out['stats']['n_new_units'], 'unit')}, now "
                      f"{plural(bank.n_units, 'unit')} in {plural(bank.n_threads, 'thread')}"
                      + (f", +{plural(out['facts']['facts_added'], 'fact')}" if bank.facts else ""))
            else:
                replaced += c.bank_id in coll
                fresh.append(c)
        if fresh:
            banks, st = build_banks(fresh, cfg, enc, llm, progress=not a.quiet)
            banks, fst = attach_facts(banks, a.facts or "none", enc, input_path=a.input, llm=llm, dayfirst=a.dayfirst,
                                      prompts=prompts)
            if a.profiles == "llm":
                made = [attach_profiles(b, llm, enc, prompts=prompts) for b in banks]
                banks, pstats = [b for b, _ in made], pstats + [s for _, s in made]
            coll.put_many(banks)
            note = f" ({replaced} replaced)" if replaced else ""
            print(f"built {plural(len(banks), 'bank')}{note}, {plural(st['n_units'], 'unit')} in {a.out} "
                  f"(encode {st['encode_units_s'] + st['encode_heads_s']:.1f}s, segment {st['segment_s']:.2f}s, "
                  f"graph {st['graph_s']:.2f}s)")
            line = _llm_summary(st, sum(len(c.sessions) for c in fresh), sum(b.n_threads for b in banks))
            if line:
                print(line)
            if a.facts not in (None, "none"):
                print(_facts_summary(fst))
        if updated:
            print(f"updated {plural(updated, 'bank')}")
        if pstats:
            print(profiles_summary(pstats))
    finally:
        if llm is not None:
            llm.close()
    return 0


def cmd_info(a) -> int:
    import numpy as np

    from .store import Collection, load_bank

    p = Path(a.dir)
    banks, quarantined = ([load_bank(p)], {}) if (p / "meta.json").exists() else _loaded(Collection(p))
    if not banks and not quarantined:
        raise TrawmemError(f"{p}: the collection holds no banks")
    lens = np.concatenate([np.diff(b.thread_offsets) for b in banks] or [np.zeros(1, np.int64)])
    info = {
        "path": str(p), "banks": len(banks), "threads": int(sum(b.n_threads for b in banks)),
        "units": int(sum(b.n_units for b in banks)), "encoder": banks[0].encoder_id if banks else None,
        "quarantined": [{"bank_id": b, "cause": c} for b, c in quarantined.items()],
        "thread_length": {"mean": round(float(lens.mean()), 2), "median": float(np.median(lens)),
                          "min": int(lens.min()), "max": int(lens.max()), "p90": float(np.percentile(lens, 90))},
        "edges": {"adjacent": int(sum((b.edge_kind == 0).sum() for b in banks) // 2),
                  "semantic": int(sum((b.edge_kind == 1).sum() for b in banks) // 2)},
        "per_bank": [{"bank_id": b.bank_id, "units": b.n_units, "threads": b.n_threads} for b in banks],
        "layers": {"facts": sum(len(b.facts) for b in banks), "profile_sections": sum(len(b.profiles) for b in banks)},
    }
    if a.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{info['path']}: {plural(info['banks'], 'bank')}, {plural(info['threads'], 'thread')}, "
          f"{plural(info['units'], 'unit')} (encoder {info['encoder']})")
    tl = info["thread_length"]
    print(f"thread length: mean {tl['mean']}, median {tl['median']}, min {tl['min']}, p90 {tl['p90']}, "
          f"max {tl['max']}")
    print(f"edges: {info['edges']['adjacent']} adjacent, {info['edges']['semantic']} semantic")
    if any(info["layers"].values()):
        print(f"layers: {plural(info['layers']['facts'], 'fact')}, "
              f"{plural(info['layers']['profile_sections'], 'profile section')}")
    for r in info["per_bank"]:
        print(f"  {r['bank_id']}: {plural(r['units'], 'unit')}, {plural(r['threads'], 'thread')}")
    if quarantined:
        print(f"quarantined: {plural(len(quarantined), 'bank')} not served (remove one with `trawmem forget "
              f"--collection {p} --bank ID`, then rebuild it):")
        for b, c in quarantined.items():
            print(f"  {b}: {c}")
    return 0


def _loaded(coll) -> tuple[list, dict]:
    """The banks of ``coll`` that load, and bank id -> cause for those that do not (quarantined)."""
    from .memory.quarantine import cause_of

    banks, bad = [], {}
    for b in coll.bank_ids:
        try:
            banks.append(coll.load(b))
        except Exception as e:  # noqa: BLE001 - one bad bank fails alone
            bad[b] = cause_of(e, coll.path)
    return banks, bad


def cmd_repair_index(a) -> int:
    from .store import repair_index

    r = repair_index(a.dir)
    extra = "".join(f"; {k} {len(r[k])}: {', '.join(map(repr, r[k][:5]))}{' ...' if len(r[k]) > 5 else ''}"
                    for k in ("added", "dropped") if r[k])
    print(f"rebuilt {Path(a.dir) / 'collection.json'} from the banks' metadata: {plural(r['banks'], 'bank')}{extra}")
    return 0


DESCRIPTION = """\
TrawMem agent memory: build memory banks from conversation histories, then select a small
complementary workspace of past turns for each question.

Run `trawmem COMMAND --help` for a command's options and their defaults. Bad input ends with a
one-line error on stderr and exit status 2; an eval whose LLM requests failed beyond
--allow-failures writes its results and exits with status 1."""


def configure_build(b: Parser) -> None:
    from .data import FORMATS
    from .llm.spec import SPEC_HELP

    b.describe("Build one bank per conversation of --input into the collection --out "
               "(bank ids become directory names as docs/cli.md describes).")
    b.add_argument("--input", required=True, help="history file: LoCoMo-layout JSON or JSONL (one turn per line)")
    b.add_argument("--out", required=True, help="collection directory (created if missing)")
    b.add_argument("--format", choices=["auto", *FORMATS], default="auto",
                   help="input format; auto picks JSONL for .jsonl/.ndjson, LongMemEval by its haystack keys, "
                        "else LoCoMo")
    add_dayfirst(b)
    b.add_argument("--segmentation", choices=["embedding", "fixed", "llm"],
                   help="thread segmentation (default: embedding, or with --update the bank's own)")
    b.add_argument("--heads", choices=["extractive", "llm"],
                   help="thread head writer (default: extractive, or with --update the bank's own)")
    b.add_argument("--fixed-size", type=positive_int, dest="fixed_size",
                   help="turns per thread with --segmentation fixed (default: 6, or with --update the bank's own)")
    b.add_argument("--encoder", help="'minilm' (the embedded all-MiniLM-L6-v2) or 'hf:/local/model/dir' "
                                     "(default: minilm, or with --update the bank's own)")
    b.add_argument("--llm", help=f"LLM for --segmentation/--heads/--facts/--profiles llm: {SPEC_HELP} (default: "
                                 "none; needed only for those)")
    add_llm_options(b)
    b.add_argument("--facts", choices=["none", "locomo", "llm"],
                   help="the facts layer: none, LoCoMo's per-session observations of --input (locomo), or atomic "
                        "facts extracted by --llm (llm); with --update, facts of the new turns only (default: none, "
                        "or with --update the bank's own)")
    b.add_argument("--profiles", choices=["none", "llm"],
                   help="the profiles layer: per-person profiles (identity, personality, interests, career, "
                        "relationships, life events, preferences) made by --llm from the facts (llm); with --update, "
                        "only the sections new facts touch change (default: none, or with --update the bank's own)")
    b.add_argument("--prompts", help="TriMem prompts file for --facts llm / --profiles llm, such as the "
                                     "best_prompts.json of `trawmem evolve-prompts` (default: the built-in prompts)")
    b.add_argument("--update", action="store_true",
                   help="append to existing banks: the input may hold a bank's whole history, a tail of it, or "
                        "only new turns; a history that conflicts with the stored one is refused")
    b.add_argument("--no-cache", action="store_true", help="do not use the on-disk embedding cache")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(fn=cmd_build)


def configure_info(i: Parser) -> None:
    i.describe("Print the bank, thread, unit and edge counts of a collection (or of one bank directory) "
               "and the thread-length distribution.")
    i.add_argument("dir", help="collection or bank directory")
    i.add_argument("--json", action="store_true", help="print the counts as JSON")
    i.set_defaults(fn=cmd_info)


def configure_repair_index(r: Parser) -> None:
    r.describe("Rebuild DIR/collection.json from the metadata of the bank directories under DIR/banks, under "
               "the collection lock (for a collection that lost its index).")
    r.add_argument("dir", help="collection directory")
    r.set_defaults(fn=cmd_repair_index)


def build_parser(commands=None) -> Parser:
    """The ``trawmem`` parser. Every command is listed with its summary; only the ``commands``
    named (all when None) get their options, so parsing one command imports one module."""
    p = Parser(prog="trawmem", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p.commands = {}
    for name, (where, summary) in COMMANDS.items():
        sp = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        p.commands[name] = sp
        if commands is None or name in commands:
            module, fn = where.split(":")
            getattr(importlib.import_module(module), fn)(sp)
    return p


def _exit_quietly_on_broken_pipe() -> int:
    """stdout's reader went away (``trawmem info --json | head``): no traceback, no more output."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd = next((x for x in argv if not x.startswith("-")), None)  # the top level has no options but -h
    p = build_parser([cmd])
    a = p.parse_args(argv)
    try:
        rc = a.fn(a)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        return _exit_quietly_on_broken_pipe()
    except KeyboardInterrupt:
        print(f"trawmem {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except TrawmemError as e:
        print(f"trawmem {a.cmd}: error: {flags_for_fields(str(e), p.commands[a.cmd])}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"trawmem {a.cmd}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
