"""The package's layout: no import cycle, imports that run one way along the pipeline, one home
per shared idea, and a Python floor that the tests run on.

The import graph is read from the source (``ast``), so nothing is imported to build it. Both
module-level imports and imports inside functions count: a cycle through a function-level
import is still a cycle in the design, only a deferred one.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "trawmem_gpu"

#: The pipeline, earliest first, as the imports run: a module may import its own layer and earlier
#: ones only (docs/architecture.md draws it). ``store`` (the bank's schema: turns, threads, the
#: thread graph, facts, profiles, the unit view, and its files) comes before ``ingest``, which
#: builds banks into it; ``head`` fits on banks that ``eval`` provides and ``score`` selects with a
#: fitted head. Shared utilities come first and import no stage.
LAYERS = (
    ("shared", ("trawmem_gpu", "trawmem_gpu.errors", "trawmem_gpu.paths", "trawmem_gpu.tokens",
                "trawmem_gpu.dictconfig", "trawmem_gpu.llm", "trawmem_gpu.http_headers",
                "trawmem_gpu.notes", "trawmem_gpu.aio")),
    ("data", ("trawmem_gpu.data",)),
    ("encode", ("trawmem_gpu.encode",)),
    ("store", ("trawmem_gpu.store",)),
    ("ingest", ("trawmem_gpu.ingest",)),
    ("select", ("trawmem_gpu.select", "trawmem_gpu.kernels")),
    ("eval", ("trawmem_gpu.eval",)),
    ("head", ("trawmem_gpu.head",)),
    ("score", ("trawmem_gpu.score",)),
    ("memory", ("trawmem_gpu.memory",)),
    ("serve", ("trawmem_gpu.serve",)),
    ("client", ("trawmem_gpu.client",)),  # the HTTP client of `serve`
    ("mcp", ("trawmem_gpu.mcp",)),  # `trawmem mcp`: a front over the memory, as the command line is
    ("integrations", ("trawmem_gpu.integrations",)),  # agent frameworks' fronts over the memory (extras)
    ("cli", ("trawmem_gpu.cli",)),  # one module per command (trawmem_gpu/cli/__init__.py: the table)
)


def _modules() -> dict[str, Path]:
    out = {}
    for base, prefix in ((PKG, "trawmem_gpu"),):
        for p in base.rglob("*.py"):
            parts = [prefix, *p.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, anywhere in its source."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        is_pkg = p.name == "__init__.py"
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m:
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _in_select(m: str) -> bool:
    return m.startswith("trawmem_gpu.select.") or m == "trawmem_gpu.select"


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest prefix naming ``module``."""
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".")) and pre.count(".") > depth:
                best, depth = i, pre.count(".")
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def test_the_graph_reader_sees_a_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    graph = import_graph()
    assert "trawmem_gpu.store.bank" in graph["trawmem_gpu.ingest.builder"]  # a module-level import
    assert "trawmem_gpu.paths" in graph["trawmem_gpu.eval.retrieval"]


def test_no_import_cycle_outside_select():
    bad = [c for c in cycles(import_graph()) if not all(_in_select(m) for m in c)]
    assert not bad, bad


def test_no_import_cycle_inside_select():
    bad = [c for c in cycles(import_graph()) if all(_in_select(m) for m in c)]
    assert not bad, bad


def test_no_earlier_stage_imports_a_later_one():
    graph = import_graph()
    bad = sorted(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                 for a, bs in graph.items() for b in bs if layer_of(b) > layer_of(a))
    assert not bad, "\n".join(bad)


def test_the_stage_check_catches_a_backward_import():
    assert layer_of("trawmem_gpu.head.relevance") < layer_of("trawmem_gpu.score.job")
    assert layer_of("trawmem_gpu.serve.config") < layer_of("trawmem_gpu.cli.query")
    assert layer_of("trawmem_gpu.store.facts") < layer_of("trawmem_gpu.ingest.layers.facts") \
        < layer_of("trawmem_gpu.select.trimem.method") < layer_of("trawmem_gpu.eval.evolve")


#: The top-level modules that are no stage: shared utilities every stage may import.
SHARED_MODULES = {"errors", "paths", "tokens", "dictconfig", "http_headers", "notes", "aio"}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph folded to the top-level packages (and loose modules) of ``trawmem_gpu``."""
    def top(m):
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {top(m): set() for m in graph}
    for a, bs in graph.items():
        out[top(a)] |= {top(b) for b in bs if top(b) != top(a)}
    return out


def test_no_package_cycle():
    """Not even through an import inside a function (the command table imports by name, not by
    an import statement, so it adds no edge)."""
    assert not cycles(package_graph(import_graph()))


def test_every_stage_is_a_package_and_loose_modules_are_shared_utilities():
    loose = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    assert loose == SHARED_MODULES, loose ^ SHARED_MODULES
    assert set(LAYERS[0][1]) - {"trawmem_gpu", "trawmem_gpu.llm"} == {f"trawmem_gpu.{m}" for m in SHARED_MODULES}
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages == {pre.split(".")[1] for _, pres in LAYERS for pre in pres if "." in pre} - SHARED_MODULES
    assert "build" not in {p.name for p in PKG.rglob("*") if p.is_dir()}  # linters and ignore files skip it


def test_the_architecture_doc_draws_these_layers():
    """docs/architecture.md lists the layers in this order, each with its packages."""
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.*?) \|", (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"),
                      re.M)
    assert [name for _, name, _ in rows] == [name for name, _ in LAYERS]
    for (_, _, cell), (name, prefixes) in zip(rows, LAYERS):
        for pre in prefixes:
            assert f"`{pre.removeprefix('trawmem_gpu.')}`" in cell or pre == "trawmem_gpu", (name, pre)


# -- one home per idea ---------------------------------------------------------------------------
def test_one_unknown_bank_exception():
    import pickle

    from trawmem_gpu.errors import UnknownBank
    from trawmem_gpu.serve import service
    from trawmem_gpu.store import collection

    assert service.UnknownBank is UnknownBank and collection.UnknownBank is UnknownBank
    e = pickle.loads(pickle.dumps(UnknownBank("b1", "requests[2]: ", " (it holds 3)")))
    assert (e.bank_id, e.where, str(e)) == ("b1", "requests[2]: ", "requests[2]: unknown bank id 'b1' (it holds 3)")
    assert isinstance(e, KeyError)


def test_json_is_parsed_by_one_helper():
    """Every JSON the package parses goes through ``errors.loads_json``, so a document nested past
    the parser is a ``ValueError`` its reader refuses, never a ``RecursionError`` (issue 42);
    ``llm.structured`` tries several parsers over a model's reply and catches it itself."""
    allowed = {PKG / "errors.py", PKG / "llm" / "structured.py"}
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PKG.rglob("*.py")) if p not in allowed
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b(json|orjson)\.loads?\(", line) and "json.loads(json.dumps(" not in line]
    assert not found, found


def test_one_file_digest_and_one_cache_root(tmp_path, monkeypatch):
    import hashlib

    from trawmem_gpu import paths
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest import cache

    f = tmp_path / "d.bin"
    f.write_bytes(b"x" * (3 << 20))
    assert paths.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    defs = [f"{p.relative_to(PKG)}:{n.name}" for p in PKG.rglob("*.py")
            for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef) and "sha256" in n.name]
    assert defs == ["paths.py:file_sha256"], defs
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "c"))
    ident = cache.build_identity("0" * 64, BuildConfig(), "all")
    assert cache.default_bank_dir(ident).parent == tmp_path / "c" / "banks"
    read_day_first = cache.build_identity("0" * 64, BuildConfig(), "all", dayfirst=True)
    assert cache.default_bank_dir(ident) != cache.default_bank_dir(read_day_first)


def test_query_params_and_their_limits_have_one_home():
    """Every front builds a query's ``QueryParams`` by ``select.params.merge_params`` and holds it to a
    ``QueryLimits``: no front restates the defaults or the bounds, and the bridges are gone."""
    from trawmem_gpu.select import params
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.remote import RemoteBackend

    assert RemoteBackend("/nonexistent.sock", ServeConfig()).defaults == params.QueryParams()
    assert ServeConfig().limits is params.SERVED_LIMITS
    for gone in ("unit_cap", "query_params", "_UNSET", "select_defaults"):
        for mod in ("select/params.py", "memory/api.py", "memory/engines.py", "serve/config.py"):
            assert not re.search(rf"\b{gone}\b\s*[=(]", (PKG / mod).read_text(encoding="utf-8")), (gone, mod)
    inner = ("select", "head")  # the engine's own stages build params for themselves, and so does
    own = ("eval/evolve.py",)   # prompt evolution, for the runs it scores (its own config's B and T)
    for p in PKG.rglob("*.py"):
        if p.relative_to(PKG).parts[0] in inner or p.relative_to(PKG).as_posix() in own:
            continue
        text = p.read_text(encoding="utf-8")
        assert not re.search(r"QueryParams\((budget|hops|token_budget)=", text), p  # merge_params builds them
        assert not re.search(r"max_(budget|hops|token_budget)\s*[:=]\s*\d", text), p  # QueryLimits holds bounds
    for p in (PKG / "serve" / "remote.py", PKG / "serve" / "ray_app.py", PKG / "serve" / "config.py"):
        assert not re.search(r"defaults = .*\(\s*\d+\s*,\s*\d+\s*,", p.read_text(encoding="utf-8")), p


# -- Python versions -------------------------------------------------------------------------------
def test_runs_on_the_python_floor_the_package_declares():
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip())
    assert m, spec
    floor = (int(m.group(1)), int(m.group(2)))
    assert sys.version_info[:2] >= floor
    assert f"Python {floor[0]}.{floor[1]}+" in (ROOT / "README.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ limits
#: Size limits of the library (``trawmem_gpu/``).
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNC_LINES, MAX_PARAMS = 500, 300, 80, 10

#: Compiled loops and kernels whose shape the compiler fixes: ``(path, function) -> reason``. A
#: Triton kernel's arguments are its launch ABI (one pointer or scalar each, no struct), and a
#: numba loop stays one function so it compiles to one loop nest (a split changes its speed).
LIMIT_EXEMPT = {
    ("trawmem_gpu/kernels/greedy.py", "_greedy_kernel"): "@triton.jit kernel: one argument per pointer / scalar / constexpr of its launch",
    ("trawmem_gpu/kernels/priority.py", "_role_weight_kernel"): "@triton.jit kernel: one argument per pointer / scalar / constexpr of its launch",
    ("trawmem_gpu/select/steps/relevance.py", "learned_row"): "@njit row kernel: its arrays are passed one by one into the compiled loop",
    ("trawmem_gpu/select/engine/compiled_loops.py", "stage_loop"): "@njit stage loop: one loop nest, split only at a cost in speed",
    ("trawmem_gpu/select/steps/greedy/compiled.py", "lazy_greedy_one"): "@njit lazy greedy: one loop nest, split only at a cost in speed",
}

#: Over a limit and not exempt, still to be split: ``(path, name, what)``. Empty: every library
#: file keeps the limits; an entry here would be a regression to be fixed.
LIMIT_PENDING: set[tuple[str, str, str]] = set()


def _library_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py"))


def _n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)


def limit_breaches(files: list[Path] | None = None) -> list[tuple[str, str, str]]:
    """``(path, name, what)`` of every limit a library file breaks (``what``: ``lines``,
    ``class``, ``function``, ``params``, ``print``, ``getLogger``)."""
    out = []
    for p in files or _library_files():
        rel, src = p.relative_to(ROOT).as_posix(), p.read_text()
        in_cli = rel.startswith("trawmem_gpu/cli/")
        if src.count("\n") > MAX_FILE_LINES:
            out.append((rel, "", "lines"))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                out.append((rel, node.name, "class"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNC_LINES:
                    out.append((rel, node.name, "function"))
                if _n_params(node) > MAX_PARAMS:
                    out.append((rel, node.name, "params"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                if not in_cli:  # the commands print; library code logs or hands lines to a callback
                    out.append((rel, "", "print"))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger":
                named = len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__"
                root = not node.args and in_cli  # a command configures the root logger
                if not (named or root):
                    out.append((rel, "", "getLogger"))
    return [b for b in out if b[:2] not in LIMIT_EXEMPT]


def test_library_code_keeps_the_size_and_logging_limits():
    breaches = set(limit_breaches())
    assert breaches <= LIMIT_PENDING, sorted(breaches - LIMIT_PENDING)
    assert not LIMIT_PENDING - breaches, f"no longer over a limit, drop from LIMIT_PENDING: {sorted(LIMIT_PENDING - breaches)}"


def test_every_limit_exemption_names_a_real_function():
    for (rel, name), reason in LIMIT_EXEMPT.items():
        tree = ast.parse((ROOT / rel).read_text())
        assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, (rel, name)
        assert reason, (rel, name)


def test_the_limit_check_sees_each_breach(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNC_LINES))
    bad = PKG / "_limits_probe_.py"
    src = (f"import logging\nlog = logging.getLogger('trawmem')\n\ndef long_one():\n{body}\n\n"
           f"def wide({', '.join(f'a{i}' for i in range(MAX_PARAMS + 1))}):\n    print(a0)\n")
    try:
        bad.write_text(src)
        got = {what for rel, _, what in limit_breaches([bad])}
    finally:
        bad.unlink()
    assert got == {"function", "params", "print", "getLogger"}


def test_every_test_file_keeps_the_size_limit():
    """The suite keeps the library's file limit too: no file under tests/ over MAX_FILE_LINES lines."""
    tests = ROOT / "tests"
    files = [p for p in tests.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    over = sorted(f"{p.relative_to(ROOT).as_posix()} ({n} lines)" for p in files
                  if (n := p.read_text(errors="replace").count("\n")) > MAX_FILE_LINES)
    assert not over, over


def test_no_folder_at_the_repository_root_shadows_an_installed_package():
    """``python -m pytest`` (and any shell opened at the root) puts the repository root first on
    ``sys.path``: a root folder named like an installed distribution's module is imported in its place.
    A root ``kernels/`` did exactly that to transformers, which imports the PyPI ``kernels`` package."""
    from importlib.metadata import packages_distributions

    installed = set(packages_distributions()) - {"trawmem_gpu"}
    root_modules = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
                    and ((p / "__init__.py").exists() or any(p.glob("*.py")))}
    root_modules |= {p.stem for p in ROOT.glob("*.py")} - {"setup"}
    assert not root_modules & installed, sorted(root_modules & installed)
