"""One bad bank fails alone: a bank whose files hold a poisoned value (a session beyond 64 bits)
or a corrupt, truncated or missing file is quarantined when the
collection opens; every other bank opens, selects and serves (``Memory`` and the HTTP server),
``trawmem info`` lists the quarantined bank with its cause, and a whole-bank forget removes it.

The poisoned values are written straight into the bank's files (with their checksums made to
match, as a write through an unchecked door would have left them): the doors refuse them now, and
this is the second line, for files already on disk."""
from __future__ import annotations

import json
import shutil

import pytest

from trawmem_gpu.errors import QuarantinedBank
from poisoned_banks import _poisoned, _rewrite_units, BAD, base, POISONS, QUESTION  # noqa: F401 - fixtures

GOOD = ("ana-ben", "acme-1", "other-1")


def _aware(units):
    units[3]["time"] = "2024-03-03T10:00:00+05:00"


@pytest.mark.parametrize("kind", list(POISONS))
def test_a_poisoned_bank_is_quarantined_and_the_others_serve(base, tmp_path, monkeypatch, kind):
    from trawmem_gpu import Memory
    from trawmem_gpu.store import Collection

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = _poisoned(base, tmp_path, kind)
    mem = Memory(coll)  # the collection opens
    words = POISONS[kind][1]
    assert list(mem.quarantined) == [BAD] and words in mem.quarantined[BAD], mem.quarantined
    assert str(tmp_path) not in mem.quarantined[BAD]  # paths relative to the collection
    rows = {r["bank_id"]: r for r in mem.banks()}
    assert sorted(rows) == sorted((*GOOD, BAD)) and rows[BAD]["quarantined"] == mem.quarantined[BAD]
    assert rows[BAD]["n_units"] is None and all("quarantined" not in rows[b] for b in GOOD)
    for b in GOOD:  # every other bank selects
        assert mem.select(b, QUESTION).unit_ids
    turn = {"turn_id": "n1", "speaker": "Ana", "text": "A new note.", "timestamp": "2031-06-01T10:00:00"}
    calls = [lambda: mem.select(BAD, QUESTION), lambda: mem.select_many([(GOOD[0], QUESTION), (BAD, QUESTION)]),
             lambda: mem.add(BAD, [turn]), lambda: mem.turns(BAD), lambda: mem.forget(BAD, ["S1:1"])]
    for call in calls:
        with pytest.raises(QuarantinedBank) as e:
            call()
        assert e.value.bank_id == BAD and words in str(e.value) and f"bank {BAD!r} is quarantined" in str(e.value)
    assert mem.add("acme-1", [turn])["appended"] == 1  # the others take writes
    # a whole-bank forget removes it, whatever its files hold
    res = mem.forget(BAD)
    assert res["deleted"] is True and res["bank_id"] == BAD
    assert not mem.quarantined and BAD not in {r["bank_id"] for r in mem.banks()}
    assert BAD not in Collection(coll) and not (coll / "banks" / BAD).exists()
    assert not list((coll / ".forget").glob("*"))
    again = Memory(coll)
    assert not again.quarantined and sorted(r["bank_id"] for r in again.banks()) == sorted(GOOD)
    assert mem.add(BAD, [turn])["created"] is True  # the id is free again


def test_a_bank_that_loads_but_does_not_prepare_for_the_engine_fails_alone(base, tmp_path, monkeypatch):
    """Whatever makes one bank's engine tables fail (here: a stand-in for a value no check knows
    of), the engine is built over the others and that bank is quarantined with the cause."""
    from trawmem_gpu import Memory
    from trawmem_gpu.select.engine import extend

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    real = extend.relevance_static

    def static(bank, *a, **k):
        if bank.bank_id == BAD:
            raise OverflowError("Python int too large to convert to C long")
        return real(bank, *a, **k)

    monkeypatch.setattr(extend, "relevance_static", static)
    mem = Memory(base)
    assert list(mem.quarantined) == [BAD]
    assert "could not be prepared for the engine (OverflowError: Python int too large" in mem.quarantined[BAD]
    for b in GOOD:
        assert mem.select(b, QUESTION).unit_ids
    with pytest.raises(QuarantinedBank):
        mem.select(BAD, QUESTION)


def test_the_cli_forgets_a_quarantined_bank_whatever_its_json_holds(base, tmp_path, monkeypatch, capsys):
    """``trawmem forget --bank`` of a bank whose ``units.json`` and ``meta.json`` nest past the
    parser removes it (it exited 1 on a ``RecursionError``, issue 42)."""
    from trawmem_gpu.cli import main

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = _poisoned(base, tmp_path, "nested units")
    POISONS["nested meta"][0](coll / "banks" / BAD)
    assert main(["forget", "--collection", str(coll), "--bank", BAD]) == 0
    assert f"forgot the whole bank of {BAD!r} (the bank is gone)" in capsys.readouterr().out
    assert not (coll / "banks" / BAD).exists()


def test_info_lists_a_quarantined_bank_and_forget_removes_it(base, tmp_path, monkeypatch, capsys):
    from trawmem_gpu.cli import main

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = _poisoned(base, tmp_path, "session 2**63")
    assert main(["info", str(coll)]) == 0
    out = capsys.readouterr().out
    assert "3 banks" in out and "quarantined: 1 bank not served" in out
    assert f"  {BAD}: banks/{BAD}: bank {BAD!r}: turn 'S3:1' has session {2 ** 63}" in out
    assert main(["info", str(coll), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [q["bank_id"] for q in info["quarantined"]] == [BAD] and info["banks"] == 3
    assert main(["forget", "--collection", str(coll), "--bank", BAD, "--turns", "S1:1"]) == 2
    assert f"bank {BAD!r} is quarantined" in capsys.readouterr().err  # only a whole-bank forget takes it
    assert main(["forget", "--collection", str(coll), "--bank", BAD]) == 0
    assert f"forgot the whole bank of {BAD!r} (the bank is gone)" in capsys.readouterr().out
    assert main(["info", str(coll), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quarantined"] == [] and sorted(b["bank_id"] for b in info["per_bank"]) == sorted(GOOD)


@pytest.mark.parametrize("kind", ["truncated tensors", "corrupt units"])
def test_the_forget_of_a_damaged_bank_erases_what_its_files_still_hold(base, kind):
    """A whole-bank forget of a bank that does not load takes its erasure from what still reads:
    the turns' texts and cache keys from ``units.json``, the vectors from the tensors."""
    from trawmem_gpu.memory.erase import Erasure
    from trawmem_gpu.memory.quarantine import stored_erasure
    from trawmem_gpu.store import Collection

    bank = Collection(base).load(BAD)
    full = Erasure.of(bank, None, (), BAD)
    d = base.parent / f"copy-{kind.replace(' ', '-')}"
    shutil.copytree(base / "banks" / BAD, d)
    POISONS[kind][0](d)
    got = stored_erasure(d, BAD, BAD)
    assert got.whole and got.dirname == BAD
    if kind == "truncated tensors":
        assert got.turn_ids == full.turn_ids and set(full.texts) <= set(got.texts)
        assert set(full.keys) <= set(got.keys) and got.vectors == [] and got.sessions == full.sessions
    else:
        assert got.turn_ids == [] and set(full.vectors) <= set(got.vectors)
        assert set(bank.heads) <= set(got.texts)


def test_a_bank_stored_with_an_aware_time_opens_and_serves_as_utc(base, tmp_path, monkeypatch):
    """Banks written before the turn schema normalized times may hold aware times (a ``Z`` or offset
    timestamp): they are read as naive UTC, beside the naive banks, never quarantined, and every
    call on them works (listing, select, add, reopen after the next write)."""
    from datetime import datetime

    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = tmp_path / "coll"
    shutil.copytree(base, coll)
    _rewrite_units(coll / "banks" / BAD, _aware)
    mem = Memory(coll)
    assert not mem.quarantined
    times = [t.time for t in mem.turns(BAD)]
    assert all(t is None or t.tzinfo is None for t in times) and datetime(2024, 3, 3, 5, 0) in times
    assert {r["bank_id"] for r in mem.banks()} == {*GOOD, BAD}
    assert mem.select(BAD, QUESTION).unit_ids
    turn = {"turn_id": "n1", "speaker": "Ana", "text": "A new note.", "timestamp": "2031-06-01T10:00:00"}
    assert mem.add(BAD, [turn])["appended"] == 1
    again = Memory(coll)
    assert not again.quarantined and "n1" in {t.turn_id for t in again.turns(BAD)}
