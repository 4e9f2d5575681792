"""The suite's runner, from the repository root:

    python -m benchmarks list                 # the index: every entry, what it measures, how long it takes
    python -m benchmarks run NAME [ARGS...]   # run an entry; ARGS go to its script (--help included)

``run`` imports the entry's module and calls its ``main()`` with ``sys.argv`` set to the
script's path and ``ARGS`` (what ``python benchmarks/SCRIPT.py ARGS`` would see), and the result
files record the runner's command; a shell entry runs under bash. The table is
``benchmarks.SUITE``. Experiments (``benchmarks/experiments/``) are not entries:
``python -m benchmarks.experiments.NAME``.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

from . import SUITE, entry

HERE = Path(__file__).resolve().parent


def index() -> str:
    """The index :func:`main` prints for ``list``: one block per entry."""
    lines = []
    for e in SUITE:
        lines.append(f"{e.name:<18} {e.script:<22} {e.takes}")
        lines += textwrap.wrap(e.measures, 96, initial_indent=" " * 4, subsequent_indent=" " * 4)
        if e.results:
            lines += textwrap.wrap("-> " + ", ".join(e.results), 96, initial_indent=" " * 4,
                                   subsequent_indent=" " * 7)
    return "\n".join(lines)


def shell_help(path: Path) -> str:
    """A shell entry's ``--help``: the comment block at the top of its file."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        if not line.startswith("#"):
            break
        out.append(line[2:])
    return "\n".join(out)


def run(name: str, args: list[str]) -> int:
    """Run the entry ``name`` with ``args``; its exit status."""
    try:
        e = entry(name)
    except KeyError:
        print(f"benchmarks: no entry {name!r}; `python -m benchmarks list` shows them: "
              f"{', '.join(x.name for x in SUITE)}", file=sys.stderr)
        return 2
    path = HERE / e.script
    if e.module is None:
        if {"-h", "--help"} & set(args):
            print(shell_help(path))
            return 0
        return subprocess.call(["bash", str(path), *args])
    from . import harness

    mod = importlib.import_module(e.module)
    sys.argv = [str(path), *args]
    harness.RUN_AS = ["python", "-m", "benchmarks", "run", e.name]
    return mod.main() or 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["list"] and len(argv) == 1:
        print(index())
        return 0
    if argv[:1] == ["run"] and len(argv) >= 2:
        return run(argv[1], argv[2:])
    asked = argv[:1] in (["-h"], ["--help"])
    usage = "\n\n".join(__doc__.split("\n\n")[:2])
    print(usage, file=sys.stdout if asked else sys.stderr)
    return 0 if asked else 2

if __name__ == "__main__":
    sys.exit(main())
