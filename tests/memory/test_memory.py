"""The Python API (issue 22.1): ``from trawmem_gpu import Memory``; add, select, select_many,
banks; the same engine and picks as the CLI and the server; thread safety."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from trawmem_gpu.data import load_conversations, sample_path
from trawmem_gpu.data.jsonl import record_of
from trawmem_gpu.errors import ConfigError, DuplicateTurns, InputError, TrawmemError, UnknownBank

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Where does Ben's sister live?"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def sample():
    return load_conversations(sample_path())[0]


def _records(turns, bank_id=None):
    return [record_of(t) for t in turns]


def test_import_is_light_until_memory_is_used():
    code = ("import sys, trawmem_gpu; assert 'torch' not in sys.modules; "
            "from trawmem_gpu import Memory; assert 'torch' not in sys.modules; print(Memory.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "trawmem_gpu.memory.api"
    import trawmem_gpu

    with pytest.raises(AttributeError):
        trawmem_gpu.NoSuchThing  # noqa: B018


def test_the_issue_snippet_runs_as_written(tmp_path, sample, monkeypatch):
    """Issue 22's snippet, verbatim but for the data it is handed (turns, q1, q2)."""
    monkeypatch.chdir(tmp_path)
    turns = list(sample.turns)  # Turn objects; dicts are the other accepted form (below)
    q1, q2 = "Which cat did Clara adopt?", "What did Zed buy?"
    from trawmem_gpu import Memory

    mem = Memory("memories/")
    mem.add("ana-ben", turns)
    mem.add("other", [{"turn_id": "x1", "speaker": "Zed", "text": "I bought a red kayak.", "timestamp": "2031-05-01"}])
    ws = mem.select("ana-ben", "Where does Ben's sister live?", token_budget=800)
    print(ws.text, ws.units, ws.tokens)
    wss = mem.select_many([("ana-ben", q1), ("other", q2)], budget=16)
    mem.forget("ana-ben", turn_ids=["S1:6"]); mem.forget("other")  # noqa: E702 - as the issue writes it
    assert ws.tokens <= 800 and "S1:8" in ws.unit_ids and ws.text.startswith("## ")
    assert [w.bank_id for w in wss] == ["ana-ben", "other"] and wss[1].unit_ids == ["x1"]
    assert [b["bank_id"] for b in mem.banks()] == ["ana-ben"]
    assert "S1:6" not in {t.turn_id for t in mem.turns("ana-ben")}
    assert (tmp_path / "memories" / "collection.json").exists()


def test_add_creates_then_appends_and_equals_a_build(tmp_path, sample):
    from trawmem_gpu import Memory
    from trawmem_gpu.ingest import build_banks

    mem = Memory(tmp_path / "m")
    r1 = mem.add("ana-ben", _records(sample.turns[:20]))  # dicts
    r2 = mem.add("ana-ben", list(sample.turns[20:]))  # Turn objects
    assert (r1["created"], r1["appended"], r2["created"], r2["appended"]) == (True, 20, False, 13)
    (full,), _ = build_banks([sample], progress=False)
    got = mem._core.registry.get("ana-ben")
    assert got.heads == full.heads and np.array_equal(got.thread_offsets, full.thread_offsets)
    assert mem.banks() == [{"bank_id": "ana-ben", "n_units": 33, "n_threads": full.n_threads, "n_sessions": 3,
                            "first_date": "2024-03-02T10:15:00", "last_date": "2024-04-22T09:05:00"}]
    again = mem.add("ana-ben", [{k: v for k, v in r.items() if k != "session"} for r in _records(sample.turns[:1], "ana-ben")])
    assert again["appended"] == 0 and again["already_stored"] == [sample.turns[0].turn_id]  # a retry is safe
    other = [{**{k: v for k, v in r.items() if k != "session"}, "text": "Other words."}
             for r in _records(sample.turns[:1], "ana-ben")]
    with pytest.raises(DuplicateTurns, match="already holds turn ids .* with other content"):
        mem.add("ana-ben", other, atomic=True)
    res = mem.add("ana-ben", other)  # per item: refused, naming the field
    assert res["appended"] == 0 and [(x["field"], x["status"]) for x in res["items"]] == [("turns[0].turn_id", "refused")]
    assert "with other content" in res["refused"][0]["reason"]
    bad = [([{"turn_id": "n1", "text": "x", "timestamp": "2031-01-01"}], r"turns\[0\]: missing field 'speaker'"),
           ([3], r"turns\[0\]: expected a dict or an object with turn_id"),
           ([{**_records(sample.turns[:1], "ana-ben")[0], "bank_id": "other", "turn_id": "n9"}],
            r"turns\[0\]\.bank_id: 'other' is not the bank")]  # a record for another bank
    for turns, msg in bad:
        with pytest.raises(InputError, match=msg):
            mem.add("ana-ben", turns, atomic=True)
        assert mem.add("ana-ben", turns)["refused"][0]["field"].startswith("turns[0]")
    assert mem._core.registry.get("ana-ben").n_units == 33  # nothing added by the refused calls
    # a second Memory over the same directory sees what the first wrote
    assert Memory(tmp_path / "m").banks() == mem.banks()


def test_same_engine_and_picks_as_the_server_and_the_cli(tmp_path, sample, capsys):
    from trawmem_gpu import Memory
    from trawmem_gpu.cli import main
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import QueryParams

    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(sample.turns))
    bank = mem._core.registry.get("ana-ben")
    z = mem._core.encoder.encode([QUESTION], is_query=True)
    for kw, qp in (({}, QueryParams()), ({"budget": 5, "hops": 2}, QueryParams(budget=5, hops=2)),
                   ({"token_budget": 200}, QueryParams(budget=None, token_budget=200))):
        want = SelectionEngine([bank]).select_units(["ana-ben"], [QUESTION], z, params=qp)[0]
        ws = mem.select("ana-ben", QUESTION, **kw)
        assert ws.unit_ids == [bank.turns[i].turn_id for i in sorted(want)]
        assert main(["query", "--bank", str(tmp_path / "m"), "--question", QUESTION, "--json",
                     *[x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]]) == 0
        cli = json.loads(capsys.readouterr().out)
        assert cli["units"] == ws.unit_ids and cli["workspace"] == ws.text and cli["tokens"] == ws.tokens
    # a question vector given skips the encoder and picks the same
    assert mem.select("ana-ben", QUESTION, vector=z[0]).unit_ids == mem.select("ana-ben", QUESTION).unit_ids


def test_select_many_is_one_engine_call(tmp_path, sample):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(sample.turns))
    mem.add("other", [{"turn_id": "x1", "speaker": "Zed", "text": "I bought a red kayak.", "timestamp": "2031-05-01"}])
    eng = mem._core.engines.engine
    calls, enc_calls = [], []
    orig, orig_enc = eng.select_units, mem._core.encoder.inner.encode
    eng.select_units = lambda *a, **k: calls.append(len(a[0])) or orig(*a, **k)
    mem._core.encoder.inner.encode = lambda texts, **k: enc_calls.append(len(texts)) or orig_enc(texts, **k)
    qs = [("ana-ben", QUESTION), ("other", "kayak?"), ("ana-ben", "How did the race go?")]
    wss = mem.select_many(qs, budget=4)
    assert calls == [3] and enc_calls == [3]
    singles = [mem.select(b, q, budget=4) for b, q in qs]
    assert [w.unit_ids for w in wss] == [w.unit_ids for w in singles]
    assert all(len(w.units) <= 4 for w in wss)


def test_errors_are_the_package_own(tmp_path, sample):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(sample.turns))
    with pytest.raises(UnknownBank, match="queries\\[1\\]: unknown bank id 'nope'"):
        mem.select_many([("ana-ben", "x"), ("nope", "y")])
    with pytest.raises(ConfigError, match="`budget` must lie in"):
        mem.select("ana-ben", QUESTION, budget=0)
    with pytest.raises(ConfigError, match="`hops` must lie in"):
        mem.select("ana-ben", QUESTION, hops=99)
    with pytest.raises(InputError, match="question is empty"):
        mem.select("ana-ben", "  ")
    with pytest.raises(InputError, match=r"dates\[0\]"):
        mem.select("ana-ben", QUESTION, date="not a date")
    with pytest.raises(UnknownBank):
        mem.forget("nope")
    for bad in ([[1.0, 2.0, 3.0]], [["a"] * 384] * 2):  # a size no reshape fits; not numbers
        with pytest.raises(InputError, match="vectors: expected 2 finite vectors"):
            mem.select_many([("ana-ben", "x"), ("ana-ben", "y")], vectors=bad)
    for e in (UnknownBank("x"), ConfigError("x"), InputError("x"), DuplicateTurns("x")):
        assert isinstance(e, TrawmemError)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrawmemError, match="is a file"):
        Memory(tmp_path / "file")


def test_date_reaches_the_engine(tmp_path, sample):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(sample.turns))
    assert mem.select("ana-ben", QUESTION, date="2024-05-01").date_used
    assert not mem.select("ana-ben", QUESTION).date_used
    # per query: an undated query batched with a dated one does not report a date
    dated, undated = mem.select_many([("ana-ben", QUESTION)] * 2, dates=["2024-05-01", None])
    assert dated.date_used and not undated.date_used


def test_concurrent_select_and_add(tmp_path, sample):
    """Selections on four threads while two threads add turns (to one bank and to new banks):
    every add lands, every selection answers from a whole bank (old or new), and afterwards the
    picks equal those of a Memory opened fresh on the directory."""
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(sample.turns[:12]))
    rest = list(sample.turns[12:])
    errors, seen = [], []
    stop = threading.Event()

    def adder_same():
        try:
            for k in range(0, len(rest), 3):
                mem.add("ana-ben", rest[k:k + 3])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def adder_new():
        try:
            for i in range(4):
                mem.add(f"b{i}", [{"turn_id": f"t{i}", "speaker": "Zed", "text": f"kayak number {i}",
                                   "timestamp": "2031-05-01"}])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def reader():
        try:
            while not stop.is_set():
                ws = mem.select("ana-ben", QUESTION, budget=6)
                seen.append(ws.unit_ids)
                for i in range(4):
                    if f"b{i}" in mem:
                        assert mem.select(f"b{i}", "kayak?").unit_ids == [f"t{i}"]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(4)]
    writers = [threading.Thread(target=adder_same), threading.Thread(target=adder_new)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(timeout=600)
    stop.set()
    for t in readers:
        t.join(timeout=600)
    assert not errors, errors
    assert seen and all(0 < len(u) <= 6 for u in seen)
    ids = {t.turn_id for t in sample.turns}
    assert all(set(u) <= ids for u in seen)
    assert mem._core.registry.get("ana-ben").n_units == len(sample.turns)
    assert [b["bank_id"] for b in mem.banks()] == ["ana-ben", "b0", "b1", "b2", "b3"]
    fresh = Memory(tmp_path / "m")
    assert fresh.select("ana-ben", QUESTION, budget=6).unit_ids == mem.select("ana-ben", QUESTION, budget=6).unit_ids


def test_api_doc_names_every_public_method_and_error():
    from trawmem_gpu.memory import Memory

    doc = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    public = [m for m in dir(Memory) if not m.startswith("_")]
    missing = [m for m in public if not re.search(rf"\b{m}\b", doc)]
    assert not missing, missing
    for err in ("UnknownBank", "InputError", "DuplicateTurns", "ConfigError", "BankError", "TrawmemError"):
        assert err in doc, err


def test_build_config_is_read_while_another_append_publishes_a_bank(tmp_path):
    """A first append reads the collection's build config while an append of another bank, on
    another thread, publishes that bank: the read must not iterate the live bank table."""
    from trawmem_gpu.memory.banks import BankRegistry

    reg = BankRegistry(tmp_path / "c")

    class Publishing:  # a bank whose config is read just as another thread publishes a new bank
        @property
        def build_config(self):
            with reg._lock:
                reg._banks["y"] = object()
            return None

    reg._banks["x"] = Publishing()
    assert reg.build_config("minilm").encoder == "minilm"


def test_no_token_budget_for_one_call_of_a_memory_with_one_falls_back_to_the_unit_budget(tmp_path):
    """``Memory(token_budget=T)`` has no default unit cap; a call that turns the token budget off
    (``token_budget=None``) gets the default B, not a ConfigError about ``budget``."""
    from trawmem_gpu import Memory
    from trawmem_gpu.select.params import QueryParams

    mem = Memory(tmp_path / "m", token_budget=800)
    assert mem.defaults.budget is None and mem._params(None, {"token_budget": 800}, 1)[0].budget is None
    (qp,) = mem._params(None, {"token_budget": None}, 1)
    assert (qp.budget, qp.token_budget) == (QueryParams().budget, None)
    with pytest.raises(UnknownBank):  # the parameters pass; the bank is what is missing
        mem.select("nope", QUESTION, token_budget=None)
