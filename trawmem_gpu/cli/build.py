"""``trawmem build``: one memory bank per conversation of a history file, or ``--update`` of stored banks
(Stage 1, :mod:`trawmem_gpu.ingest`, with the facts and profile layers of ``--facts`` / ``--profiles``:
their steps, in their order, are ``ingest.layers.steps``)."""
from __future__ import annotations

from .args import Parser, add_dayfirst, add_llm_options, positive_int
from ..errors import plural


def _overrides(a) -> dict:
    return {k: getattr(a, k) for k in ("segmentation", "heads", "encoder", "fixed_size")
            if getattr(a, k, None) is not None}


def _build_config(a, base: dict | None = None):
    """Config from the flags given, on top of ``base`` (a stored bank's config) or the defaults."""
    from ..ingest.config import BuildConfig

    return BuildConfig.from_dict({**(base or {}), **_overrides(a)})


def _llm_summary(stats: dict, n_sessions: int, n_threads: int) -> str | None:
    seg, head = int(stats.get("llm_segment_fallbacks", 0)), int(stats.get("llm_head_fallbacks", 0))
    parts = ([f"{seg} of {n_sessions} sessions fell back to embedding segmentation"] if seg else []) + \
            ([f"{head} of {n_threads} heads fell back to extractive"] if head else [])
    return "LLM: " + ", ".join(parts) + " (malformed, refused or failed replies; `trawmem info` lists why)" \
        if parts else None


def _facts_summary(st: dict) -> str:
    """One line on the facts a build added and what was repaired or dropped on the way."""
    extra = [f"{k.replace('_', ' ')} {v}" for k, v in st.items() if k != "facts_added" and k != "facts" and v]
    return f"facts: {plural(st.get('facts_added', 0), 'fact')} added" + (f" ({', '.join(extra)})" if extra else "")


def _appender(a, c, out: dict, run, pstats: list):
    """``Collection.update``'s function for an ``--update`` of ``c``'s bank: the bank with the new
    turns of ``c`` appended (and its layers extended over them: ``ingest.layers.steps``), None when
    nothing is new; the run's counts go into ``out``."""
    from ..ingest.history import new_turns
    from ..ingest.late import add_turns
    from ..ingest.layers.steps import check_update, sources_of, update_layers
    from ..store.records import stamped

    def append(old):
        turns, late, derived = new_turns(old, c, dayfirst=a.dayfirst)
        sources = sources_of(_given(a), old)  # the bank's own, unless given
        check_update(old, sources, run)
        if not turns:
            return None
        turns = stamped(turns)  # when they were stored (``Turn.stored_at``)
        # An update continues with the bank's own build config unless flags override it; late turns
        # are stored at their place in time, as ``Memory.add`` stores them (``ingest.late``).
        bank, out["stats"] = add_turns(old, turns, late, derived, _build_config(a, old.build_config), run.encoder,
                                       run.llm)
        bank, st = update_layers(old, bank, turns, sources, run)
        out["facts"] = st.get("facts", {"facts_added": 0})
        if "profiles" in st:
            pstats.append(st["profiles"])
        return bank
    return append


def _given(a) -> dict:
    """The layers' sources the flags give (None: not given)."""
    from ..ingest.layers.steps import STEPS

    return {s.layer: getattr(a, s.layer, None) for s in STEPS}


def cmd_build(a) -> int:
    from ..ingest import build_banks
    from ..data import load_conversations
    from ..ingest.layers.steps import StepRun, build_layers, needs_llm, sources_of
    from ..encode import get_encoder
    from ..llm.factory import llm_from_args, llm_options
    from ..store import Collection
    from ..store.segments import CompactionPolicy

    cfg = _build_config(a)
    convs = load_conversations(a.input, a.format, dayfirst=a.dayfirst)
    coll = Collection(a.out, create=True)
    coll.compaction = CompactionPolicy(background=False)  # an --update's segments are merged when due, before exit
    skipped = sum(c.skipped_empty for c in convs)
    if skipped:
        print(f"skipped {plural(skipped, 'turn')} with empty text and no caption")
    fresh_sources = sources_of(_given(a), requires=not a.update)
    prompts = None
    if a.prompts:
        from ..ingest.layers.prompts import load_prompt_set

        prompts = load_prompt_set(a.prompts)
    from ..ingest.layers.profiles import profiles_summary

    from ..llm.base import LLMWork, work_line

    pstats = []
    llm = llm_from_args(a.llm, check=True, **llm_options(a)) \
        if (cfg.segmentation == "llm" or cfg.heads == "llm" or needs_llm(_given(a))
            or (a.update and a.llm)) else None
    work = LLMWork(llm).__enter__()
    try:
        enc = get_encoder(cfg.encoder, cache=not a.no_cache)
        run = StepRun(enc, llm, prompts, a.input, a.dayfirst)
        fresh, updated, replaced = [], 0, 0
        for c in convs:
            if a.update and c.bank_id in coll:
                out = {}
                bank = coll.update(c.bank_id, _appender(a, c, out, run, pstats))
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
            from dataclasses import replace

            from ..store.records import stamped, utc_now

            at = utc_now()  # when they were stored (``Turn.stored_at``), one time for the build
            fresh = [replace(c, turns=stamped(c.turns, at)) for c in fresh]
            banks, st = build_banks(fresh, cfg, enc, llm, progress=not a.quiet)
            banks, lst = build_layers(banks, fresh_sources, run)
            pstats += lst.get("profiles", [])
            coll.put_many(banks)
            note = f" ({replaced} replaced)" if replaced else ""
            print(f"built {plural(len(banks), 'bank')}{note}, {plural(st['n_units'], 'unit')} in {a.out} "
                  f"(encode {st['encode_units_s'] + st['encode_heads_s']:.1f}s, segment {st['segment_s']:.2f}s, "
                  f"graph {st['graph_s']:.2f}s)")
            line = _llm_summary(st, sum(len(c.sessions) for c in fresh), sum(b.n_threads for b in banks))
            if line:
                print(line)
            if "facts" in lst:
                print(_facts_summary(lst["facts"]))
        if updated:
            print(f"updated {plural(updated, 'bank')}")
        if pstats:
            print(profiles_summary(pstats))
        work.__exit__(None, None, None)
        if llm is not None:
            print(work_line(work.report()["totals"]))
    finally:
        if llm is not None:
            llm.close()
    return 0


def configure(b: Parser) -> None:
    from ..data import FORMATS
    from ..llm.spec import SPEC_HELP

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
