"""Shared pieces of the command line: the parser class, value types and option groups.

Values are checked by argparse ``type=`` functions, so a bad ``--budget 0`` is refused at parse
time, naming the flag (``argument --budget: must be at least 1, got 0``), before any model
loads. Every parser shows each option's default in its help. Library errors name fields in
backquotes (```token_budget```); :func:`flags_for_fields` turns them into this command's flags.

**Ranges.** Every numeric option has a range, checked here at parse time; the upper caps guard
against typos that would run for hours (selection cost grows with H and B), far above any useful value:

* ``--hops`` (and ``serve --max-hops``): 0 .. ``MAX_HOPS`` (8); selection cost grows with H
* ``--budget``, ``train-head --steps``, ``serve --max-budget``: 1 .. ``MAX_BUDGET`` (4096 units)
* ``--token-budget``, ``serve --max-token-budget``: 1 .. ``MAX_TOKEN_BUDGET`` (1,000,000 tokens)
* ``train-affinity --C``: above 0, at most ``MAX_C`` (1e4), finite
* ``train-head --lr``, ``--temp``: above 0, finite; ``--l2``: 0 or more, finite; ``--epochs``:
  1 .. 100,000
* ``--port``: 0 .. 65535; ``--k``: 1 .. 100,000 each; ``--llm-retries``: 0 .. 100
* timeouts and deadlines: above 0, finite; counts (``--allow-failures``, ``--warmup``): 0 or
  more; sizes (``--batch-size``, ``--threads``...): 1 or more
"""
from __future__ import annotations

import argparse
import math
import re

from ..llm.factory import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S
from ..select.params import MAX_BUDGET, MAX_HOPS, MAX_TOKEN_BUDGET  # the bounds of QueryParams, one home


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default after its help the way it is typed on the command line.

    ``(default: X)`` for a set default (a list as ``1,2,3``), ``(required)`` for a required
    option, nothing for an on/off flag or when the help states its default itself. An option
    whose default is unset (None) says in its own help what happens without it; the formatter
    never prints ``None`` (``tests/cli/test_cli_help.py`` holds every command to this)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "%(default)" in h or "default:" in h or not action.option_strings:
            return h
        if action.required:
            return h + " (required)"
        if action.nargs == 0 or action.default is None or action.default is argparse.SUPPRESS:
            return h
        return f"{h} (default: {shown_default(action.default)})"


def shown_default(value) -> str:
    """A default as a user types it: ``1,2,3`` for a list or tuple, else ``str(value)``."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class RawHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``HelpFormatter`` that keeps a multi-paragraph description as written."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose subcommand parsers share its help formatter."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)
        self.describe(self.description)

    def describe(self, text: str | None) -> None:
        """Set the description (a multi-paragraph one is printed as written)."""
        self.description = text
        if self.formatter_class is HelpFormatter and "\n\n" in (text or ""):
            self.formatter_class = RawHelpFormatter

    def add_subparsers(self, **kw):
        kw.setdefault("parser_class", Parser)
        return super().add_subparsers(**kw)


#: Library field names whose flag is not ``--`` + the field with dashes (``token_budget`` ->
#: ``--token-budget`` needs no entry: every option's own dest maps to it). The first of a field's
#: flags that the running command has is used. One table: only the CLI speaks of flags.
FIELD_FLAGS: dict[str, tuple[str, ...]] = {
    "timeout_s": ("--timeout", "--llm-timeout"), "deadline_s": ("--llm-deadline",),
    "max_retries": ("--llm-retries",), "concurrency": ("--llm-concurrency",), "context_tokens": ("--llm-context",),
    "constrain": ("--llm-constrain",), "strict": ("--strict-llm",), "keys_file": ("--keys",), "bank_cache": ("--banks",),
    "banks_dir": ("--banks",), "ks": ("--k",), "workers": ("--ray-workers",), "methods": ("--method",),
}


def flags_for_fields(message: str, parser: argparse.ArgumentParser) -> str:
    """A library error message for the command line: each field named in backquotes
    (```token_budget```) becomes the flag of ``parser`` that sets it (``--token-budget``).
    A name that no flag of this command sets keeps its backquotes."""
    flags = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    known = set(flags.values())
    for field, options in FIELD_FLAGS.items():
        flag = next((o for o in options if o in known), None)
        if flag:
            flags[field] = flag
    return re.sub(r"`(\w+)`", lambda m: flags.get(m.group(1), m.group(0)), message)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer of at least 1 (``--budget``, ``--fixed-size``...)."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def nonneg_int(text: str) -> int:
    """An integer of at least 0 (``--hops``, ``--allow-failures``...)."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite number above 0 (``--llm-timeout``...)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return v


MAX_C = 1e4
"""Largest ``train-affinity --C`` (inverse L2 strength); larger lets a separable fit diverge."""


def int_range(lo: int, hi: int | None = None):
    """argparse type: an integer in ``lo..hi`` (``hi`` None: no cap)."""
    def parse(text: str) -> int:
        v = _int(text)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {v}" if lo else f"must be 0 or more, got {v}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be at most {hi}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def float_range(lo: float = 0.0, hi: float | None = None, *, lo_open: bool = True):
    """argparse type: a finite number above ``lo`` (at least ``lo`` when not ``lo_open``), at most ``hi``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if v < lo or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(f"must be {'above' if lo_open else 'at least'} {lo:g}, got {text}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be at most {hi:g}, got {text}")
        return v

    parse.__name__ = "number"
    return parse


hops_int = int_range(0, MAX_HOPS)
"""``--hops``: 0 .. MAX_HOPS."""
budget_int = int_range(1, MAX_BUDGET)
"""``--budget``: 1 .. MAX_BUDGET."""
token_budget_int = int_range(1, MAX_TOKEN_BUDGET)
"""``--token-budget``: 1 .. MAX_TOKEN_BUDGET."""
port_int = int_range(0, 65535)
"""``--port``: 0 (a free one) .. 65535."""
nonneg_float = float_range(0.0, lo_open=False)
"""A finite number of at least 0 (``--max-wait-ms``, ``--l2``)."""


def categories(text: str) -> tuple[int, ...]:
    """``1,2,3,4`` -> (1, 2, 3, 4): LoCoMo question categories 1-5."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 5:
            raise argparse.ArgumentTypeError(f"expected comma-separated categories 1-5, got {text!r}")
        out.append(int(part))
    return tuple(dict.fromkeys(out))


def add_dayfirst(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dayfirst", action="store_true",
                   help="read ambiguous dates such as 01.02.2031 day first (1 February); without it, month "
                        "first (January 2). Dates with a day above 12 read the same either way, and a date "
                        "that starts with its year (2031/05/13, ISO 8601) is always year, month, day")


def add_affinity_weights(p: argparse.ArgumentParser) -> None:
    p.add_argument("--affinity-weights", metavar="FILE",
                   help="learned-affinity weights from `trawmem train-affinity` (default: the shipped ones)")


def llm_concurrency(text: str):
    """``--llm-concurrency``: ``auto`` (None: fitted to the endpoint) or 1 .. 256."""
    if text.strip().lower() == "auto":
        return "auto"
    return int_range(1, 256)(text)


llm_concurrency.__name__ = "integer or auto"


def add_llm_options(p: argparse.ArgumentParser) -> None:
    """The request options every LLM-using command takes (``llm.factory.llm_options`` reads them)."""
    p.add_argument("--llm-timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="seconds the server may spend on one LLM request (its wait in this client's queue not "
                        "counted) before it is abandoned; a streamed one is cancelled on the server, a plain one "
                        "is waited for again, never sent twice (default: derived per request from its prompt, "
                        "its reply budget and the server's measured speed, so a slow local model has time)")
    p.add_argument("--llm-retries", type=int_range(0, 100), default=DEFAULT_RETRIES, metavar="N",
                   help="retries of a failed LLM request (timeouts, 429, 5xx), with exponential backoff (0..100)")
    p.add_argument("--llm-deadline", type=positive_float, default=None, metavar="SECONDS",
                   help="limit on all LLM requests of the run together, counted from the first one; requests "
                        "still open when it passes fail, and a rerun retries them (default: no limit)")
    p.add_argument("--llm-concurrency", type=llm_concurrency, default="auto", metavar="N",
                   help="LLM requests in flight at once; auto: one at a time for a server seen to answer one at a "
                        "time (llama.cpp's default), up to 16 for one that serves several at once")
    p.add_argument("--llm-context", type=int_range(256, 10_000_000), default=None, metavar="TOKENS",
                   help="the model's context length, which sizes extraction windows (default: as the server lists "
                        "it, or learned from the first prompt it finds too long)")
    p.add_argument("--llm-constrain", choices=["schema", "json"], default="schema",
                   help="structured LLM calls send their reply's JSON schema so the server constrains decoding to "
                        "it (schema; a server that refuses schemas gets JSON mode, reported once), or ask for JSON "
                        "mode alone (json)")
    p.add_argument("--strict-llm", action="store_true",
                   help="make any LLM fallback an error: a malformed, refused (ungrounded, degenerate) or failed "
                        "LLM output stops the run instead of falling back (extractive head, embedding "
                        "segmentation, no fact, the question alone) and being counted")


def add_token_budget(p: argparse.ArgumentParser, fill: bool = False) -> None:
    """``--token-budget T`` (and, for commands that run the baselines, ``--fill``)."""
    p.add_argument("--token-budget", type=token_budget_int, metavar="T",
                   help="workspace token budget: the rendered workspace (cl100k_base, thread heads included) holds "
                        "at most T tokens; without --budget there is no cap on the number of units (default: no "
                        "token budget)")
    from ..select.config import SelectConfig
    from ..select.workspace import HEADINGS

    p.add_argument("--headings", choices=list(HEADINGS),
                   help="what TrawMem's workspace shows per thread (and its token budget pays for): a date heading "
                        "(date), the date and the thread head's gist (gist), or no heading and a date on every "
                        f"line (none) (default: {SelectConfig.default('headings')}, or "
                        f"{SelectConfig.default('headings', paper=True)} "
                        "with --paper)")
    if fill:
        p.add_argument("--fill", choices=["skip", "stop"], default="skip",
                       help="how the baselines fill --token-budget: skip a unit that would overflow and go on down "
                            "the ranking, or stop at the first one")


def add_query_params(p: argparse.ArgumentParser, fill: bool = False) -> None:
    """The query parameters of every command that selects with TrawMem's flags: ``--budget``,
    ``--token-budget`` (with ``--headings``, and ``--fill`` where ``fill``) and ``--hops``; the
    defaults their help names are ``QueryParams``'s."""
    from ..select.params import QueryParams

    d0 = QueryParams()
    p.add_argument("--budget", type=budget_int,
                   help=f"workspace budget B: units selected per question (default: {d0.budget}; with "
                        "--token-budget: a cap on the units, none unless given)")
    add_token_budget(p, fill=fill)
    p.add_argument("--hops", type=hops_int, help=f"propagation hops H over the thread graph (default: {d0.hops})")


def banks_cache_dir() -> str:
    """Where automatic bank caches live (``TRAWMEM_CACHE`` honoured), for help texts."""
    from ..paths import default_cache_dir

    return str(default_cache_dir() / "banks")


def add_method(p: argparse.ArgumentParser, trimem_llm: bool = True) -> None:
    """``--method`` (and the planning LLM ``--plan-llm`` of TriMem and planned TrawMem, with
    ``--follow-up``, where ``trimem_llm``)."""
    p.add_argument("--method", choices=["trawmem", "cosine", "bm25", "hybrid", "full", "trimem"], default="trawmem",
                   help="selection method (trimem: TriMem's facts, their source turns and profiles; needs banks "
                        "built with --facts)")
    if trimem_llm:
        from ..llm.spec import SPEC_HELP

        p.add_argument("--plan-llm", help=f"with --method trimem: the LLM of TriMem's key-information and "
                                          "target-query steps; with --method trawmem: planned TrawMem, the "
                                          "engine's picks for each of the planner's searches merged into one "
                                          f"workspace; {SPEC_HELP} (default: none, the question is the only search)")
        p.add_argument("--follow-up", action="store_true",
                       help="with --method trawmem --plan-llm: a second stage, one more LLM call per question "
                            "with its workspace so far, for at most 2 searches for evidence it still lacks, whose "
                            "picks fill the last quarter of the budget")


def add_engine(p: argparse.ArgumentParser) -> None:
    """``--engine``: the same default for every command that selects for many questions."""
    p.add_argument("--engine", choices=["batched", "reference"], default="batched",
                   help="TrawMem implementation: the batched engine or the step-by-step NumPy reference (both "
                        "select the same units)")


def add_ablation(p: argparse.ArgumentParser) -> None:
    from ..select.config import ABLATIONS, SelectConfig

    p.add_argument("--ablation", choices=list(ABLATIONS), default=SelectConfig.default("ablation"),
                   help="one Section 5.2 ablation")


def add_head(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", help="learned role head (safetensors) from `trawmem train-head` (default: none, the "
                                  "hand-set role weights)")


def units_list(text: str) -> tuple[str, ...]:
    """``--units turns,facts,profiles`` -> the layers, checked (``store.view.parse_units``)."""
    from ..errors import ConfigError
    from ..store.view import parse_units

    try:
        return parse_units(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("`units`: ").removeprefix("`units` ")) from None


def add_units(p: argparse.ArgumentParser, facts: bool = False) -> None:
    """``--units`` (the layers TrawMem selects from) and, for commands that build their banks
    from a data file, ``--facts`` (a facts layer for banks built without one)."""
    p.add_argument("--units", type=units_list, default=("turns",), metavar="L,L,...",
                   help="the layers selection takes units from: turns, facts, profiles (comma-separated, turns "
                        "included); facts and profiles need banks built with them (build --facts/--profiles)")
    if facts:
        p.add_argument("--facts", choices=["none", "locomo"], default="none",
                       help="give banks without a facts layer LoCoMo's per-session observations of the data file "
                            "(encoded, not stored), as build --facts locomo would")


def where_json(text: str):
    """``--where JSON``: a filter over turn metadata (``data.filters``), parsed at parse time, so a
    bad one is refused naming the flag and the path inside the filter."""
    import json

    from ..data.filters import parse_filter
    from ..errors import InputError, loads_json

    try:
        obj = loads_json(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # nested too deeply
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    try:
        return parse_filter(obj, "where")
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_where(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--where", type=where_json, metavar="JSON", help=help)
