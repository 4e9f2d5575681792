"""The ``trawmem`` command line: one module per command, named in one table and imported when it runs.

:data:`COMMANDS` maps every command to the module that holds it and its one-line summary. Each
command module defines ``configure(parser)``, which adds the command's options and sets its
function (``parser.set_defaults(fn=...)``). ``trawmem --help`` reads only the table, so it
imports no command module; ``trawmem eval ...`` imports ``trawmem_gpu.cli.eval`` alone, and that
module imports torch, numba, faiss or transformers inside its command function, when the command
runs (pip's layout: the parser learns a command's options only when that command is asked for).
Option groups that several commands share (query parameters, LLM request options, value types)
are defined once, in :mod:`trawmem_gpu.cli.args`.
"""
from __future__ import annotations

import importlib
import os
import sys

from ..errors import TrawmemError
from ..notes import said_by
from .args import Parser, flags_for_fields

#: command -> (module defining ``configure(parser)``, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("trawmem_gpu.cli.build",
              "build one memory bank per conversation into a collection (or --update it)"),
    "info": ("trawmem_gpu.cli.info", "bank, thread and unit counts of a collection or bank"),
    "repair-index": ("trawmem_gpu.cli.repair_index",
                     "rebuild a collection's index (collection.json) from its banks' metadata"),
    "query": ("trawmem_gpu.cli.query", "print the workspace for one question"),
    "export": ("trawmem_gpu.cli.export", "write banks of a collection as JSON Lines (docs/export.md)"),
    "import": ("trawmem_gpu.cli.import_", "import a JSON Lines export into a collection"),
    "history": ("trawmem_gpu.cli.history", "what happened to a unit of a bank, and when a turn was said and stored"),
    "forget": ("trawmem_gpu.cli.forget",
               "forget turns of a bank, or a whole bank, in its files and every cache"),
    "eval": ("trawmem_gpu.cli.eval",
             "retrieval (and optionally answer) quality on LoCoMo-layout data"),
    "demo": ("trawmem_gpu.cli.demo", "build the bundled sample conversation and show workspaces"),
    "score": ("trawmem_gpu.cli.score",
              "offline scoring: workspaces JSONL for a batch of questions (resumable)"),
    "sweep": ("trawmem_gpu.cli.sweep",
              "quality, context tokens and latency over a hops x budget grid, with the Pareto-optimal cells"),
    "train-head": ("trawmem_gpu.cli.train_head",
                   "train the learned role head (A, M(delta), weights) from gold evidence"),
    "train-affinity": ("trawmem_gpu.cli.train_affinity",
                       "fit the learned affinity (--affinity-weights) from gold evidence labels"),
    "evolve-prompts": ("trawmem_gpu.cli.evolve_prompts",
                       "evolve TriMem's extraction and profile prompts on a dev split (TextGrad-style, resumable)"),
    "serve": ("trawmem_gpu.cli.serve",
              "HTTP selection service with dynamic batching and API keys (extra: serve)"),
    "serve-key": ("trawmem_gpu.cli.serve_key",
                  "create an API key for `trawmem serve` (prints it once)"),
    "mcp": ("trawmem_gpu.cli.mcp",
            "Model Context Protocol server (stdio or streamable HTTP) with add, recall, forget tools (extra: mcp)"),
}

DESCRIPTION = """\
TrawMem agent memory: build memory banks from conversation histories, then select a small
complementary workspace of past turns for each question.

Run `trawmem COMMAND --help` for a command's options and their defaults. Bad input ends with a
one-line error on stderr and exit status 2; an eval whose LLM requests failed beyond
--allow-failures writes its results and exits with status 1."""


def build_parser(commands=None) -> Parser:
    """The ``trawmem`` parser. Every command is listed with its summary; only the ``commands``
    named (all when None) get their options, so parsing one command imports one module."""
    p = Parser(prog="trawmem", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p.commands = {}
    for name, (module, summary) in COMMANDS.items():
        sp = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        p.commands[name] = sp
        if commands is None or name in commands:
            importlib.import_module(module).configure(sp)
    return p


def _exit_quietly_on_broken_pipe() -> int:
    """stdout's reader went away (``trawmem info --json | head``): no traceback, no more output."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


def _say_err(line: str) -> None:
    """A library note on stderr, as it happens."""
    print(line, file=sys.stderr, flush=True)


def _say_out(line: str) -> None:
    """A library line meant for stdout (an evaluation's summary)."""
    print(line)


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd = next((x for x in argv if not x.startswith("-")), None)  # the top level has no options but -h
    p = build_parser([cmd])
    a = p.parse_args(argv)
    try:
        with said_by(_say_err, _say_out):  # the library's notes of this run, printed (trawmem_gpu.notes)
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
