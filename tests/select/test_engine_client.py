"""The engine client (``select/client.py``) is the one selection call (issue 43 item 1): no other
module of the package calls an engine's ``select_units`` or ``masks_of``, and a front parses its
filter once and turns it into masks once per request."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "trawmem_gpu"

#: The engine's selection methods: only the client calls them.
SELECTION = {"select_units", "masks_of"}

#: Modules that may call them besides the client, and why: the engines themselves (a
#: ``SelectionEngine.select_units`` with a filter makes its masks by its own ``masks_of``).
EXCEPTIONS = {
    "trawmem_gpu/select/client.py": "the engine client",
    "trawmem_gpu/select/engine/__init__.py": "the engine itself: select_units(where=) calls its own masks_of",
}


def selection_calls(files) -> list[str]:
    """``path:line name`` of every call ``<anything>.select_units(...)`` / ``.masks_of(...)`` in ``files``."""
    out = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SELECTION:
                rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else p.name
                out.append(f"{rel}:{node.lineno} {node.func.attr}")
    return out


def test_only_the_engine_client_calls_the_engines_selection():
    files = [p for p in sorted(PKG.rglob("*.py"))
             if p.relative_to(ROOT).as_posix() not in EXCEPTIONS]
    found = selection_calls(files)
    assert not found, "call select.client (select / run) instead:\n" + "\n".join(found)
    for rel in EXCEPTIONS:  # each exception is needed: it does call them
        assert selection_calls([ROOT / rel]), f"{rel} no longer calls the engine's selection: drop it"


def test_the_check_sees_a_direct_call(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(eng):\n    return eng.engine.select_units([], [], None), eng.masks_of([])\n")
    assert sorted(c.split(" ", 1)[1] for c in selection_calls([probe])) == ["masks_of", "select_units"]


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    from trawmem_gpu import Memory

    d = tmp_path_factory.mktemp("ec")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAWMEM_CACHE", str(d / "cache"))
    m = Memory(d / "c")
    m.add("b", [{"turn_id": f"D{k}:{i}", "speaker": "Ana" if i % 2 else "Ben",
                 "text": f"{'Ana' if i % 2 else 'Ben'} on topic {k}: detail {i}.",
                 "timestamp": f"2024-03-{k + 1:02d}T10:{i:02d}:00", "metadata": {"user_id": f"u{i % 2}"}}
                for k in range(3) for i in range(6)])
    yield m
    mp.undo()


def test_a_filter_is_parsed_once_and_made_into_masks_once(mem, monkeypatch):
    """``Memory.select_many`` with one filter for three queries: the JSON is parsed once (at the
    door), the engine makes masks once (one ``masks_of`` call for the batch, one mask per query),
    and the picks are the engine's own for those masks."""
    from trawmem_gpu.data import filters
    from trawmem_gpu.select.engine import SelectionEngine

    parsed, masked = [], []
    parse, masks_of = filters.parse_filter, SelectionEngine.masks_of

    def spy_parse(f, name="where"):
        if f is not None and not isinstance(f, filters.Filter):
            parsed.append(f)
        return parse(f, name)

    def spy_masks(self, bank_ids, where=None, masks=None, snap=None):
        masked.append((list(bank_ids), where, masks))
        return masks_of(self, bank_ids, where, masks, snap)

    monkeypatch.setattr(filters, "parse_filter", spy_parse)
    monkeypatch.setattr(SelectionEngine, "masks_of", spy_masks)
    qs = [("b", "What did Ana say about topic 1?"), ("b", "topic 2?"), ("b", "What did Ben say?")]
    got = mem.select_many(qs, budget=4, where={"user_id": "u1"})
    assert len(parsed) == 1 and len(masked) == 1  # the filter parsed once; its masks made once
    assert masked[0][0] == ["b"] * 3 and masked[0][2] is None
    assert all(u.metadata["user_id"] == "u1" for w in got for u in w.units) and all(w.units for w in got)
    monkeypatch.undo()
    engine = mem._core.engines.engine
    flt = filters.parse_filter({"user_id": "u1"})
    keep = engine.masks_of(["b"] * 3, [flt] * 3)
    Z = mem._core.encoder.encode([q for _, q in qs], is_query=True)
    from trawmem_gpu.select.client import run

    direct = run(engine, ["b"] * 3, [q for _, q in qs], Z, mem.defaults.__class__(budget=4), None, keep)
    from trawmem_gpu.memory.result import SelectedWorkspace

    bank = mem._core.engines.bank("b")
    assert [w.text for w in got] == [SelectedWorkspace.of(bank, q, p, mem._core.headings, False, keep=k).text
                                     for (_, q), p, k in zip(qs, direct, keep)]


def test_the_client_groups_by_day_and_isolates_a_failing_day(mem):
    """Requests of several ``as_of`` days: one engine call per day; with ``isolate``, a day whose
    dated engine fails (here: a bank the engine does not hold) answers its requests with the
    exception, the others are selected as they would be alone."""
    from trawmem_gpu.select import client

    eng = mem._core.engines
    qp = mem.defaults
    reqs = [client.Request("b", "topic 1?", qp), client.Request("gone", "topic 2?", qp, as_of="2024-03-02"),
            client.Request("b", "topic 0?", qp)]
    got = client.select(eng, reqs, encode=lambda t: mem._core.encoder.encode(t, is_query=True), isolate=True)
    assert isinstance(got[1], Exception) and got[0].units and got[2].units
    plain = client.select(eng, [reqs[0], reqs[2]], encode=lambda t: mem._core.encoder.encode(t, is_query=True))
    assert [g.units for g in plain] == [got[0].units, got[2].units]
    with pytest.raises(KeyError):
        client.select(eng, reqs, encode=lambda t: mem._core.encoder.encode(t, is_query=True))


def test_a_bare_engine_has_no_dated_engine(mem):
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.select import client

    bare = client.Bare(mem._core.engines.engine)
    assert bare.bank("b") is mem._core.engines.bank("b")
    with pytest.raises(ConfigError, match="as_of"):
        client.select(bare, [client.Request("b", "topic 1?", mem.defaults, as_of="2024-03-02")],
                      encode=lambda t: mem._core.encoder.encode(t, is_query=True))
    with pytest.raises(ConfigError, match="need an encoder"):
        client.select(bare, [client.Request("b", "topic 1?", mem.defaults)])
