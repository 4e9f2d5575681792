"""Attacks from issue 14, each as a test: bank ids that escape, stale or tampered banks,
tracebacks on odd input, and the newcomer's rough edges. (Concurrency: test_concurrency.py;
LLM failures: test_llm.py and test_end_to_end.py; dates: test_dates.py.)

Data are tiny synthetic files written into ``tmp_path``; the embedding cache is redirected there.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trawmem_gpu.cli import build_parser, main
from trawmem_gpu.data import load_conversations, load_jsonl, load_locomo, sample_path
from trawmem_gpu.errors import BankError, InputError, UnknownBank, name_list
from trawmem_gpu.paths import file_sha256
from trawmem_gpu.store import FORMAT_VERSION, Collection, load_bank
from trawmem_gpu.store import files as store_files
from trawmem_gpu.store.collection import bank_dirname

sys.path.insert(0, str(Path(__file__).parent))
from store_writer import tiny_bank, turn  # noqa: E402
from locomo_files import write_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _rec(bank, tid, text="hello there", ts="2024-03-02T10:00:00", speaker="Ana", **extra):
    return {"bank_id": bank, "turn_id": tid, "speaker": speaker, "text": text, "timestamp": ts, **extra}


def _jsonl(path, recs, ensure_ascii=True):
    path.write_text("".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in recs), encoding="utf-8")
    return path


def _err(capsys, *fragments) -> str:
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "Traceback" not in cap.err and err.count("\n") == 0, cap.err
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


# ----------------------------------------------------------------------------------------------
# 1. bank ids never escape their directory
# ----------------------------------------------------------------------------------------------

NASTY_IDS = [".", "..", "../x", "a/b", "/etc", "..\\x", "", " ", ".hidden", "x.", "CON", "nul.txt", "Alice", "alice",
             "x" * 200, "é", "\u202e", "a b", "conv-26", "w0-b0.tmp-1", "a" * 79 + "."]


def test_bank_dirnames_are_plain_unique_and_stable():
    names = [bank_dirname(b) for b in NASTY_IDS]
    assert len(set(names)) == len(NASTY_IDS)
    for b, n in zip(NASTY_IDS, names):
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", n) and n not in (".", "..") and len(n) <= 120, (b, n)
        assert bank_dirname(b) == n
    assert bank_dirname("conv-26") == "conv-26"  # plain ids keep their name


def test_dot_bank_ids_do_not_wipe_the_collection(tmp_path, cache, capsys):
    """Issue: banks `jb` and `.` printed "built 2 banks" and left a collection whose bank dirs were gone."""
    f = _jsonl(tmp_path / "h.jsonl", [_rec(b, f"{i}", f"message {i} of bank {b!r} about the weather")
                                      for b in ("jb", ".", "..", "../up") for i in range(3)])
    out = tmp_path / "out"
    assert main(["build", "--input", str(f), "--out", str(out), "--quiet"]) == 0
    assert "built 4 banks" in capsys.readouterr().out
    coll = Collection(out)
    assert set(coll.bank_ids) == {"jb", ".", "..", "../up"}
    for b in coll.bank_ids:
        assert [t.turn_id for t in coll.load(b).turns] == ["0", "1", "2"]
        assert coll.bank_path(b).parent == out / "banks"
    assert not (tmp_path / "up").exists()
    assert main(["info", str(out)]) == 0 and "4 banks" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# 3. stale or tampered data is refused, never used silently
# ----------------------------------------------------------------------------------------------

def _truncated(data: Path, dst: Path) -> Path:
    """The same conversations with only their first session (banks built "from half the data")."""
    samples = json.loads(data.read_text())
    for s in samples:
        for k in [k for k in s["conversation"] if k.startswith("session_2")]:
            del s["conversation"][k]
        s["qa"] = []
    dst.write_text(json.dumps(samples))
    return dst


def test_eval_refuses_banks_built_from_other_turns(tmp_path, cache, capsys):
    data = write_data(tmp_path / "tiny.json")
    banks = tmp_path / "banks"
    assert main(["build", "--input", str(_truncated(data, tmp_path / "half.json")), "--out", str(banks),
                 "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "r.json"
    assert main(["eval", "--data", str(data), "--banks", str(banks), "--output", str(out)]) == 2
    _err(capsys, "bank 'conv-a'", "built from other turns", "bank: 6 turns, data: 12", f"remove {banks}")
    assert not out.exists()
    # banks of the data it is given are used
    assert main(["eval", "--data", str(data), "--banks", str(tmp_path / "fresh"), "--output", str(out)]) == 0
    assert main(["eval", "--data", str(data), "--banks", str(tmp_path / "fresh"), "--output", str(out)]) == 0


def test_eval_refuses_other_bank_sets_and_build_configs(tmp_path, cache, capsys):
    data = write_data(tmp_path / "tiny.json")
    samples = json.loads(data.read_text())
    one = tmp_path / "one.json"
    one.write_text(json.dumps(samples[:1]))
    b1 = tmp_path / "b1"
    assert main(["build", "--input", str(one), "--out", str(b1), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--banks", str(b1), "--output", str(tmp_path / "r.json")]) == 2
    _err(capsys, "lacks 1 bank(s)", "'conv-b'")
    # a fixed-segmentation ablation cannot reuse embedding-segmented banks
    b2 = tmp_path / "b2"
    assert main(["build", "--input", str(data), "--out", str(b2), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--banks", str(b2), "--ablation", "fixed_segmentation",
                 "--output", str(tmp_path / "r.json")]) == 2
    _err(capsys, "another build config", "segmentation")


def test_eval_refuses_a_corrupt_bank_instead_of_rebuilding_it(tmp_path, cache, capsys):
    data = write_data(tmp_path / "tiny.json")
    banks = tmp_path / "banks"
    assert main(["eval", "--data", str(data), "--banks", str(banks), "--output", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    units = banks / "banks" / "conv-a" / "units.json"
    units.write_bytes(units.read_bytes()[:-10])
    before = {p: p.stat().st_mtime_ns for p in banks.rglob("*") if p.is_file()}
    assert main(["eval", "--data", str(data), "--banks", str(banks), "--output", str(tmp_path / "r.json")]) == 2
    _err(capsys, "units.json", "checksum mismatch", "--banks")
    assert {p: p.stat().st_mtime_ns for p in banks.rglob("*") if p.is_file()} == before  # left as it was


def test_automatic_cache_says_when_it_rebuilds(tmp_path, cache, capsys):
    from trawmem_gpu.eval.retrieval import banks_for

    data = write_data(tmp_path / "tiny.json")
    _, banks, cdir = banks_for(data, progress=False)
    assert cdir.parent == tmp_path / "cache" / "banks"  # the one bank cache, shared with `trawmem score`
    t = next(cdir.glob("banks/*/tensors.safetensors"))
    t.write_bytes(t.read_bytes()[:50])
    _, again, cdir2 = banks_for(data, progress=False)
    assert cdir2 == cdir and "bank cache is unusable" in capsys.readouterr().err
    assert [b.n_units for b in again] == [b.n_units for b in banks]
    _, third, _ = banks_for(data, progress=False)
    assert "unusable" not in capsys.readouterr().err


def test_index_and_bank_identity_must_agree(tmp_path):
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    coll.put(tiny_bank("a", [turn("a1", 1), turn("a2", 1)]))
    coll.put(tiny_bank("b", [turn("b1", 1)]))
    shutil.rmtree(d / "banks" / "b")
    shutil.copytree(d / "banks" / "a", d / "banks" / "b")  # b's directory now holds bank a, checksums intact
    with pytest.raises(BankError, match=r"holds bank 'a' where the collection index expects 'b'"):
        Collection(d).load("b")


def test_duplicate_turn_ids_in_a_stored_bank(tmp_path):
    """A fully consistent tamper (checksums and digests recomputed) still fails the structure check."""
    from trawmem_gpu.data.types import turns_digest

    p = store_files.save_bank(tiny_bank("a", [turn("a1", 1), turn("a2", 1)]), tmp_path / "a")
    units = json.loads((p / "units.json").read_text())
    units[1]["id"] = "a1"
    (p / "units.json").write_text(json.dumps(units))
    meta = json.loads((p / "meta.json").read_text())
    meta["checksums"]["units.json"] = file_sha256(p / "units.json")
    meta["turns_sha256"] = turns_digest([store_files.turn_from(r) for r in units])
    meta["meta_sha256"] = store_files.meta_digest(meta)
    (p / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BankError, match="duplicate turn id 'a1'"):
        load_bank(p)


# ----------------------------------------------------------------------------------------------
# 5. clear errors instead of tracebacks
# ----------------------------------------------------------------------------------------------

def test_lone_surrogate_is_an_input_error(tmp_path, capsys):
    f = tmp_path / "s.jsonl"
    f.write_text(json.dumps(_rec("b", "1")) + "\n" + json.dumps(_rec("b", "2", "bad \ud800 here")) + "\n")
    assert main(["build", "--input", str(f), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _err(capsys, f"{f}:2", "'text'", "lone surrogate")
    loc = write_data(tmp_path / "l.json")
    loc.write_text(loc.read_text().replace("Hi Bob!", "Hi \\udfff Bob!"))
    with pytest.raises(InputError, match=r"conversation.session_1\[0\]: field 'text' holds a lone surrogate"):
        load_locomo(loc)


def test_invalid_utf8_names_the_line(tmp_path, capsys):
    f = tmp_path / "u.jsonl"
    f.write_bytes(json.dumps(_rec("b", "1")).encode() + b"\n" + json.dumps(_rec("b", "2")).encode()[:-3]
                  + b"\xff\xfe\"}\n")
    assert main(["build", "--input", str(f), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _err(capsys, f"{f}:2", "not UTF-8", "0xff")


def test_scalar_evidence_is_a_counted_repair(tmp_path):
    loc = write_data(tmp_path / "l.json")
    s = json.loads(loc.read_text())
    s[0]["qa"][0]["evidence"] = 5
    s[0]["qa"][1]["evidence"] = "D1:1"
    loc.write_text(json.dumps(s))
    conv = load_locomo(loc)[0]
    assert conv.questions[0].evidence == () and conv.repairs.dropped_unparseable == 1
    assert conv.questions[1].evidence == ("D1:1",)


def test_input_directory_and_output_file(tmp_path, capsys):
    assert main(["build", "--input", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _err(capsys, "is a directory")
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["build", "--input", str(sample_path()), "--out", str(f), "--quiet"]) == 2
    _err(capsys, str(f), "is a file")
    busy = tmp_path / "home"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert main(["build", "--input", str(sample_path()), "--out", str(busy), "--quiet"]) == 2
    _err(capsys, "is not a collection", "notes.txt")


@pytest.mark.parametrize("index,msg", [
    ({"format_version": FORMAT_VERSION, "encoder_id": None, "banks": ["a", "b"]}, "field 'banks' must be an object"),
    ({"format_version": str(FORMAT_VERSION), "encoder_id": None, "banks": {}}, "format_version must be an integer"),
    ({"format_version": FORMAT_VERSION, "encoder_id": None, "banks": {"a": "../../etc"}}, "not a plain name"),
    ({"format_version": FORMAT_VERSION, "encoder_id": None, "banks": {"a": "x", "b": "x"}}, "share one directory"),
    ([1, 2], "expected a JSON object"),
    ({"format_version": 1, "banks": {}}, "format version 1"),
])
def test_corrupt_collection_index(tmp_path, capsys, index, msg):
    (tmp_path / "collection.json").write_text(json.dumps(index))
    assert main(["info", str(tmp_path)]) == 2
    _err(capsys, "collection.json", msg)


def test_info_into_a_closed_pipe(tmp_path):
    """`trawmem info DIR --json | head`: the reader leaves early; no traceback, no 'Exception ignored'."""
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    for i in range(3):
        coll.put(tiny_bank(f"b{i}", [turn(f"b{i}-{k}", 1) for k in range(3)]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "info", str(d), "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the command writes anything
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


def test_u2028_inside_a_jsonl_string(tmp_path):
    f = _jsonl(tmp_path / "l.jsonl", [_rec("b", "1", "line one\u2028line two\u2029and \x85 more"),
                                      _rec("b", "2", "next")], ensure_ascii=False)
    (conv,) = load_jsonl(f)
    assert [t.text for t in conv.turns] == ["line one\u2028line two\u2029and \x85 more", "next"]


def _same_in_both_formats(tmp_path, turn_fields: dict):
    """Load one turn (plus a plain one) written as JSONL and as LoCoMo; returns both results."""
    out = []
    base = {"speaker": "Ana", "text": "plain words"}
    j = _jsonl(tmp_path / "t.jsonl", [_rec("b", "1", base["text"]), {**_rec("b", "2"), **turn_fields}])
    loc_turn = {"speaker": turn_fields.get("speaker", "Ana"), "dia_id": "2", "text": turn_fields.get("text"),
                **({"blip_caption": turn_fields["caption"]} if "caption" in turn_fields else {})}
    loc = tmp_path / "t.json"
    loc.write_text(json.dumps([{"sample_id": "b", "conversation": {
        "speaker_a": "Ana", "speaker_b": "Ben", "session_1_date_time": "2024-03-02T10:00:00",
        "session_1": [{**base, "dia_id": "1"}, loc_turn]}}]))
    for fn, p in ((load_jsonl, j), (load_locomo, loc)):
        try:
            (c,) = fn(p)
            out.append(("ok", [(t.turn_id, t.text, t.caption) for t in c.turns], c.skipped_empty))
        except InputError as e:
            m = re.search(r"field '(\w+)'.*", str(e))
            out.append(("error", m.group(0).replace("blip_caption", "caption") if m else str(e)))
    return out


@pytest.mark.parametrize("fields,expect", [
    ({"text": ""}, "skipped"),
    ({"text": "   ", "caption": None}, "skipped"),
    ({"text": "", "caption": "a photo of a cat"}, "kept"),
    ({"text": "hi", "caption": ""}, "kept"),
    ({"text": "hi", "caption": 5}, "field 'caption' must be a string, got number 5"),
    ({"text": 2.5}, "field 'text' must be a string, got number 2.5"),
    ({"text": 7}, "field 'text' must be a string, got number 7"),
    ({"text": None}, "field 'text' must be a string, got null"),
])
def test_one_rule_for_both_formats(tmp_path, fields, expect):
    j, loc = _same_in_both_formats(tmp_path, fields)
    assert j == loc, (j, loc)
    if expect == "skipped":
        assert j[0] == "ok" and len(j[1]) == 1 and j[2] == 1
    elif expect == "kept":
        assert j[0] == "ok" and len(j[1]) == 2 and j[2] == 0
    else:
        assert j == ("error", expect)


# ----------------------------------------------------------------------------------------------
# 7. newcomer friction
# ----------------------------------------------------------------------------------------------

def test_readme_setup_uses_a_virtual_environment():
    readme = (ROOT / "README.md").read_text()
    setup = readme[:readme.index("## Python")]
    assert "python3 -m venv" in setup and "activate" in setup


def _sample_lines():
    return sample_path().read_text(encoding="utf-8").splitlines(keepends=True)


@pytest.mark.parametrize("split,start", [(20, 20), (20, 12), (8, 8)])
def test_update_from_append_only_or_overlapping_file(tmp_path, cache, capsys, split, start):
    """The README's `--update` with a file of only the new turns (start == split), or one that
    repeats the last stored turns (start < split), equals a full build."""
    from bank_compare import assert_banks_equal

    lines = _sample_lines()
    part, new = tmp_path / "part.jsonl", tmp_path / "new.jsonl"
    part.write_text("".join(lines[:split]))
    new.write_text("".join(lines[start:]))
    inc, full = tmp_path / "inc", tmp_path / "full"
    assert main(["build", "--input", str(part), "--out", str(inc), "--quiet"]) == 0
    assert main(["build", "--input", str(new), "--out", str(inc), "--update", "--quiet"]) == 0
    assert f"updated ana-ben: +{len(lines) - split} units" in capsys.readouterr().out
    assert main(["build", "--input", str(sample_path()), "--out", str(full), "--quiet"]) == 0
    assert_banks_equal(Collection(inc).load("ana-ben"), Collection(full).load("ana-ben"), exact=False)
    # the same file again adds nothing
    assert main(["build", "--input", str(new), "--out", str(inc), "--update", "--quiet"]) == 0
    assert "nothing new" in capsys.readouterr().out


def test_update_refuses_conflicting_histories(tmp_path, cache, capsys):
    lines = _sample_lines()
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:20]))
    inc = tmp_path / "inc"
    assert main(["build", "--input", str(part), "--out", str(inc), "--quiet"]) == 0
    capsys.readouterr()
    recs = [json.loads(x) for x in lines]
    cases = {
        "gap": (recs[15:17] + recs[18:], "has turn 'S2:"),           # a stored turn missing from the repeat
        "reorder": (recs[20:22] + [recs[5]], "already stored"),       # a stored id among the new turns
        "speaker": ([{**recs[19], "speaker": "Eve"}] + recs[20:], "field 'speaker'"),
    }
    for name, (rs, msg) in cases.items():
        f = _jsonl(tmp_path / f"{name}.jsonl", rs)
        assert main(["build", "--input", str(f), "--out", str(inc), "--update", "--quiet"]) == 2, name
        _err(capsys, "--update: bank 'ana-ben'", msg, "rebuild")
    assert Collection(inc).load("ana-ben").n_units == 20


@pytest.mark.parametrize("argv,msg", [
    (["query", "--bank", "B", "--question", "q", "--budget", "0"], "argument --budget: must be at least 1, got 0"),
    (["query", "--bank", "B", "--question", "q", "--hops", "-2"], "argument --hops: must be 0 or more, got -2"),
    (["eval", "--data", "D", "--output", "o", "--budget", "x"], "argument --budget: expected an integer, got 'x'"),
    (["eval", "--data", "D", "--output", "o", "--categories", "1,x"], "argument --categories: expected"),
    (["eval", "--data", "D", "--output", "o", "--llm-timeout", "0"], "argument --llm-timeout: must be a positive"),
    (["eval", "--data", "D", "--output", "o", "--allow-failures", "-1"], "argument --allow-failures"),
    (["build", "--input", "I", "--out", "o", "--fixed-size", "0"], "argument --fixed-size: must be at least 1"),
])
def test_flags_checked_at_parse_time(capsys, monkeypatch, argv, msg):
    import trawmem_gpu.encode as enc

    monkeypatch.setattr(enc, "get_encoder", lambda *a, **k: pytest.fail("loaded a model before checking flags"))
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2 and msg in capsys.readouterr().err
    assert "self." not in msg


def test_eval_missing_data_and_data_without_questions(tmp_path, cache, capsys):
    assert main(["eval", "--data", str(tmp_path / "nope.json"), "--output", str(tmp_path / "r.json")]) == 2
    err = _err(capsys, "nope.json: file not found")
    assert "Errno" not in err
    out = tmp_path / "r.json"
    assert main(["eval", "--data", str(sample_path()), "--output", str(out)]) == 2
    _err(capsys, "no question with gold evidence", "can be built, not evaluated")
    assert not out.exists()


def test_bank_lists_in_errors_say_how_many_are_left_out(tmp_path, capsys):
    assert name_list(["a", "b"]) == "'a', 'b'"
    assert name_list(list("abcdefg")) == "'a', 'b', 'c', 'd', 'e', ... (2 more)"
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    for i in range(7):
        coll.put(tiny_bank(f"b{i}", [turn(f"b{i}-1", 1)]))
    with pytest.raises(UnknownBank) as ei:
        coll.load("nope")
    assert str(ei.value).endswith("(it holds 7: 'b0', 'b1', 'b2', 'b3', 'b4', ... (2 more))")
    assert main(["query", "--bank", str(d), "--question", "hi"]) == 2
    _err(capsys, "holds 7 banks", "... (2 more)")


def _help_lines(parser) -> dict:
    """option -> its whole help entry."""
    text = parser.format_help()
    out = {}
    for a in parser._actions:
        for s in a.option_strings:
            if s.startswith("--") and s != "--help":
                m = re.search(rf"^  {re.escape(s)}\b.*?(?=^  -|\Z)", text, re.M | re.S)
                out[s] = " ".join(m.group(0).split()) if m else ""
    return out


def test_every_option_shows_its_default():
    """Every command is listed; each option states its default as typed, is marked required, or is a
    flag (the full walk, with descriptions and no ``None``: ``tests/test_cli_help.py``)."""
    p = build_parser()
    top = p.format_help()
    assert set(p.commands) == {"build", "info", "query", "eval", "demo", "train-head", "train-affinity", "sweep",
                               "score", "serve", "serve-key", "repair-index", "forget", "evolve-prompts", "mcp"}
    for name, sp in p.commands.items():
        assert name in top
        flags = {s for a in sp._actions if a.nargs == 0 for s in a.option_strings}
        for opt, entry in _help_lines(sp).items():
            assert opt in flags or "(default:" in entry or "(required)" in entry, (name, opt, entry)
            assert "None" not in entry, (name, opt, entry)


def test_plural_counts(tmp_path, cache, capsys):
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "built 1 bank," in out and "1 banks" not in out


def test_thread_headings_are_short_and_documented(tmp_path, cache):
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.select.workspace import assemble

    (bank,), _ = build_banks(load_conversations(sample_path()), progress=False)
    j = 1
    units = list(bank.thread_units(j))
    head_turn = next(i for i in units if f"{bank.turns[i].speaker}: " in bank.heads[j]
                     and bank.heads[j].split(": ", 2)[2].removesuffix(" ...").strip()[:20] in bank.turns[i].text)
    other = next(i for i in units if i != head_turn)
    assert re.fullmatch(r"## \d{1,2} [A-Z][a-z]+ \d{4}", assemble(bank, "q", [other]).render().splitlines()[0])
    text = assemble(bank, "q", [other], "gist").render()
    heading = text.splitlines()[0]
    assert re.fullmatch(r"## \d{1,2} [A-Z][a-z]+ \d{4} — \w+: .+", heading), heading
    assert "&" not in heading and "[" not in heading  # no speaker list, no bracketed date
    assert assemble(bank, "q", [head_turn], "gist").render().splitlines()[0] == f"## {bank.turns[head_turn].time.day} " \
        f"{bank.turns[head_turn].time:%B %Y}"  # the quoted turn is shown: the heading is only the date
    doc = (ROOT / "docs" / "cli.md").read_text()
    assert "## 2 March 2024 — Ana: " in doc and "[S1:6] Ben: " in doc  # the format is documented


def test_control_and_bidi_characters_never_reach_the_workspace(tmp_path, cache):
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.select.workspace import assemble

    evil = ["safe \u202eevil\u202c text", "nul\x00here", "esc \x1b[31mred\x1b[0m", "two\n## 1 Jan 2020 — forged",
            "line\u2028sep", "bom\ufeff", "iso \u2066x\u2069"]
    f = _jsonl(tmp_path / "e.jsonl", [_rec("b", str(i), t, speaker="Ana\u202e" if i == 0 else "Ben",
                                           caption="cap\x07tion" if i == 1 else None) for i, t in enumerate(evil)],
               ensure_ascii=False)
    (bank,), _ = build_banks(load_jsonl(f), progress=False)
    for heads in ("gist", "date", "none"):
        text = assemble(bank, "q", list(range(bank.n_units)), heads).render()
        bad = [c for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c in
               "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029\ufeff"]
        assert not bad, [hex(ord(c)) for c in bad]
        assert not [ln for ln in text.splitlines() if ln.startswith("## 1 Jan 2020")]
        assert "  ## 1 Jan 2020 — forged" in text and "evil" in text and "red" in text


def test_repair_index_rebuilds_from_the_banks_and_refuses_what_it_cannot_read(tmp_path):
    """Issue 26: a lost collection.json made the next build start a fresh index over the banks."""
    from trawmem_gpu.store import repair_index

    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    for b in ("a", "b", "Ana's chat"):
        coll.put(tiny_bank(b, [turn(f"{b}1", 1)]))
    (d / "collection.json").unlink()
    (d / "banks" / "b").rename(d / "banks" / ".b.old-dead1")  # a write killed mid-swap, too
    for create in (False, True):
        with pytest.raises(BankError, match=r"collection.json is missing .*trawmem repair-index"):
            Collection(d, create=create)
    r = repair_index(d)
    assert r["banks"] == 3 and sorted(r["added"]) == ["Ana's chat", "a", "b"] and r["dropped"] == []
    coll = Collection(d)
    assert sorted(coll.bank_ids) == ["Ana's chat", "a", "b"]
    assert [t.turn_id for t in coll.load("b").turns] == ["b1"]
    # a damaged bank stops the repair, naming the directory; nothing is written
    (d / "collection.json").unlink()
    meta = d / "banks" / "a" / "meta.json"
    meta.write_text(meta.read_text().replace('"n_units"', '"n_unitz"'))
    with pytest.raises(BankError, match=r"banks/a.*remove or move"):
        repair_index(d)
    assert not (d / "collection.json").exists()


# ----------------------------------------------------------------------------------------------
# 8. the last traceback classes of a re-audit (issue 24): each a one-line error or a counted repair
# ----------------------------------------------------------------------------------------------
def _lme_with(tmp_path, where: str) -> Path:
    """A synthetic LongMemEval file whose ``where`` (a field of instance 1) holds ``\\ud800``,
    spelled as JSON spells it (the escape, not a raw surrogate, which no UTF-8 file can hold)."""
    from lme_synthetic import instances

    data = instances(3)
    inst = data[1]
    if where == "content":
        inst["haystack_sessions"][2][0]["content"] += " MARK"
    elif where == "session id":
        inst["haystack_session_ids"][0] += "MARK"
    else:
        inst[where] += " MARK"
    f = tmp_path / "lme.json"
    f.write_text(json.dumps(data).replace("MARK", "\\ud800"), encoding="utf-8")
    return f


@pytest.mark.parametrize("where,field", [("content", "'content'"), ("question_id", "'question_id'"),
                                         ("question", "'question'"), ("answer", "'answer'"),
                                         ("session id", "haystack_session_ids[0]")])
def test_lone_surrogates_in_longmemeval_are_input_errors(tmp_path, cache, capsys, where, field):
    from trawmem_gpu.data import load_longmemeval

    f = _lme_with(tmp_path, where)
    with pytest.raises(InputError, match=rf"instance 1.*{re.escape(field)}.*lone surrogate '\\ud800'"):
        load_longmemeval(f)
    assert main(["build", "--input", str(f), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _err(capsys, "instance 1", field, "lone surrogate")


@pytest.mark.parametrize("field", ["id", "bank_id", "question", "date"])
def test_lone_surrogates_in_score_questions_are_input_errors(tmp_path, capsys, field):
    rec = {"id": "q1", "bank_id": "b", "question": "Where did Ana go?", "date": "2031-05-02"}
    rec[field] += "MARK"
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "q0", "bank_id": "b", "question": "ok?"}) + "\n"
                 + json.dumps(rec).replace("MARK", "\\udfff") + "\n", encoding="utf-8")
    assert main(["score", "--questions", str(q), "--banks", str(tmp_path / "c"), "--out", str(tmp_path / "o.jsonl"),
                 "--quiet"]) == 2
    _err(capsys, f"{q}:2", f"'{field}'", "lone surrogate")


def _last_err(capsys, *fragments) -> str:
    """:func:`_err` on the last line of stderr (an encoder's first load may print a bar before it)."""
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err, cap.err
    err = cap.err.strip().splitlines()[-1]
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


def _unfittable(tmp_path, kind: str) -> Path:
    """A data file without a question ``train-affinity`` can fit on."""
    import lme_synthetic as L

    if kind == "category 5 only":
        f = write_data(tmp_path / "loc.json")
        d = json.loads(f.read_text())
        for s in d:
            for q in s["qa"]:
                q["category"] = 5
        f.write_text(json.dumps(d))
        return f
    if kind == "plain JSONL":
        return _jsonl(tmp_path / "t.jsonl", [_rec("b", "1"), _rec("b", "2", "and more")])
    inst = L.instances(3)
    for i in inst:
        if kind == "abstention only":
            i["question_id"] += "_abs"
        else:  # no gold: no has_answer turn
            for s in i["haystack_sessions"]:
                for t in s:
                    t["has_answer"] = False
    return L.write(tmp_path / "lme.json", inst)


@pytest.mark.parametrize("kind", ["abstention only", "no gold", "category 5 only", "plain JSONL"])
def test_train_affinity_on_data_it_cannot_fit(tmp_path, cache, capsys, kind):
    f = _unfittable(tmp_path, kind)
    assert main(["train-affinity", "--data", str(f), "--out", str(tmp_path / "w.json"), "--quiet"]) == 2
    _last_err(capsys, f"{f}: no labelled question", "gold evidence")
    assert not (tmp_path / "w.json").exists()


def test_train_affinity_fit_options_and_divergence(tmp_path, cache, capsys):
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.head.relevance import fit_relevance

    from trawmem_gpu.head.relevance import load_labelled

    f = write_data(tmp_path / "loc.json")
    for bad, msg in (("nan", "finite"), ("inf", "finite"), ("-inf", "finite"), ("0", "above 0"), ("-1", "above 0"),
                     ("1e308", "at most")):
        with pytest.raises(SystemExit) as e:
            main(["train-affinity", "--data", str(f), "--out", str(tmp_path / "w.json"), f"--C={bad}"])
        assert e.value.code == 2 and "argument --C: must be" in (err := capsys.readouterr().err) and msg in err
    for C in (float("nan"), float("inf"), 0, -2.0, True):  # the library names the field
        with pytest.raises(ConfigError, match="C must be a finite number above 0"):
            fit_relevance([], C=C)
    with pytest.raises(InputError, match="no labelled questions"):
        fit_relevance([])
    qs, _ = load_labelled(f, folds=1)
    assert len(fit_relevance(qs, C=1.0)) > 1
    with pytest.raises(ConfigError, match=r"the affinity fit diverged .* at C = 1e\+308; a smaller C"):
        fit_relevance(qs, C=1e308)  # finite, and too large to converge (the CLI caps --C below this)


def _damage(db: Path, kind: str) -> None:
    """Damage the embedding cache file ``db`` as the audit did."""
    import sqlite3

    raw = db.read_bytes()
    if kind == "truncated":
        db.write_bytes(raw[:len(raw) // 2])
    elif kind == "bit-flipped":  # flip bits in every page's header (the file header among them)
        b = bytearray(raw)
        for i in range(0, len(b), 4096):
            for k in range(i + 16, min(i + 40, len(b))):
                b[k] ^= 0x5A
        db.write_bytes(bytes(b))
    elif kind == "garbage":
        db.write_bytes(b"not a database at all " * 50)
    else:  # foreign: a database of another schema
        db.unlink()
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE notes (title TEXT)")
        con.commit()
        con.close()


def _cached_rows(db: Path) -> int:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM emb").fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("kind", ["truncated", "bit-flipped", "garbage", "foreign"])
def test_a_damaged_embedding_cache_is_set_aside_and_rebuilt(tmp_path, cache, capsys, kind):
    from trawmem_gpu.encode import EmbeddingCache

    db = cache / "embeddings.sqlite"
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    n = _cached_rows(db)
    assert n > 10
    capsys.readouterr()
    _damage(db, kind)
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "c2"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "note: the embedding cache" in err
    assert "set aside as embeddings.sqlite.bad-1" in err
    assert (cache / "embeddings.sqlite.bad-1").exists() and _cached_rows(db) == n  # rebuilt, every text again
    # the library: damage done under an open cache is found by its next write, set aside once, and
    # the write goes to the fresh cache
    import numpy as np

    c = EmbeddingCache(db)
    _damage(db, kind)
    if kind != "foreign":  # (a foreign file replaces ours: the open cache writes on to its own)
        c.put_many({"k": np.ones(4, dtype=np.float32)})
        assert c.set_aside == [cache / "embeddings.sqlite.bad-2"]
        assert EmbeddingCache(db).get_many(["k", "x"], 4)["k"].tolist() == [1.0] * 4
    else:
        assert EmbeddingCache(db).set_aside == [cache / "embeddings.sqlite.bad-2"]
    assert not EmbeddingCache(db).set_aside and len(list(cache.glob("embeddings.sqlite.bad-*"))) == 2


def test_a_damaged_embedding_cache_never_stops_query_or_score(tmp_path, cache, capsys):
    db = cache / "embeddings.sqlite"
    coll = tmp_path / "c"
    assert main(["build", "--input", str(sample_path()), "--out", str(coll), "--quiet"]) == 0
    bank_id = load_conversations(sample_path())[0].bank_id
    _damage(db, "truncated")
    assert main(["query", "--bank", str(coll), "--question", "Where does Clara live now?"]) == 0
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "set aside" in cap.err and "[S1:" in cap.out
    _damage(db, "bit-flipped")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "q1", "bank_id": bank_id, "question": "Where does Clara live now?"}) + "\n")
    assert main(["score", "--questions", str(q), "--banks", str(coll), "--out", str(tmp_path / "o.jsonl"),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "set aside as embeddings.sqlite.bad-2" in err
    assert (tmp_path / "o.jsonl").read_text().count("\n") == 1


SIDECAR_DAMAGE = {"truncated JSON": lambda raw: raw[:len(raw) // 2], "a list": lambda raw: b"[1, 2]",
                  "non-UTF-8": lambda raw: b"\xff\xfe" + raw}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A finished ``score`` run of a synthetic LongMemEval file: into ``--banks`` and into the
    automatic bank directory (the embedding cache and banks under the module's own cache)."""
    import lme_synthetic as L

    d = tmp_path_factory.mktemp("scored")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAWMEM_CACHE", str(d / "cache"))
    f = L.write(d / "lme.json", L.instances(4))
    for out, banks in (("o.jsonl", ["--banks", str(d / "bk")]), ("auto.jsonl", [])):
        assert main(["score", "--data", str(f), *banks, "--out", str(d / out), "--quiet"]) == 0
    yield d, f
    mp.undo()


def _rescore(d, f, out, banks, capsys, damaged: Path, bad):
    """Damage ``damaged`` with ``bad``, score again, and put every file back as it was."""
    files = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    damaged.write_bytes(bad(damaged.read_bytes()))
    try:
        rc = main(["score", "--data", str(f), *banks, "--out", str(d / out), "--quiet"])
        summary = d / f"{out}.summary.json"
        return rc, capsys.readouterr(), damaged.read_bytes(), json.loads(summary.read_text()) if rc == 0 else None
    finally:
        for p in d.rglob("*"):
            if p.is_file() and p not in files:
                p.unlink()
        for p, raw in files.items():
            p.write_bytes(raw)


@pytest.mark.parametrize("damage", list(SIDECAR_DAMAGE))
def test_damaged_score_sidecars(scored, capsys, monkeypatch, damage):
    """The output's ``.meta.json`` (which job wrote the records) and the collection's
    ``score-build.json`` (what its banks were built from): a clear error where they cannot be
    told again, a counted repair where they can (the automatic bank directory is named by it)."""
    d, f = scored
    monkeypatch.setenv("TRAWMEM_CACHE", str(d / "cache"))
    bad = SIDECAR_DAMAGE[damage]
    capsys.readouterr()
    banks = ["--banks", str(d / "bk")]
    rc, cap, _, _ = _rescore(d, f, "o.jsonl", banks, capsys, d / "o.jsonl.meta.json", bad)
    assert rc == 2 and "Traceback" not in cap.err and cap.err.count("\n") == 1, cap.err
    assert "o.jsonl holds 4 records, and" in cap.err and "o.jsonl.meta.json: damaged sidecar" in cap.err \
        and "--overwrite" in cap.err
    rc, cap, _, _ = _rescore(d, f, "o.jsonl", banks, capsys, d / "bk" / "score-build.json", bad)
    assert rc == 2 and "Traceback" not in cap.err and cap.err.count("\n") == 1, cap.err
    assert "score-build.json: damaged sidecar" in cap.err and "cannot be reused" in cap.err
    auto = next((d / "cache" / "banks").iterdir()) / "score-build.json"  # the one bank cache
    good = json.loads(auto.read_text())
    rc, cap, now, summary = _rescore(d, f, "auto.jsonl", [], capsys, auto, bad)
    assert rc == 0 and "Traceback" not in cap.err and "note:" in cap.err and "rewritten" in cap.err, cap.err
    assert "4 already in" in cap.out and json.loads(now) == good
    assert summary["build"]["sidecars_repaired"] == 1


@pytest.mark.parametrize("argv", [["eval", "--data", "d.json", "--engine", "batched", "--output", "o.json"],
                                  ["score", "--data", "d.json", "--out", "o.jsonl"], ["sweep", "--data", "d.json"]])
def test_huge_budgets_are_refused_at_parse_time(capsys, argv):
    """``--budget 1000000000`` allocated 22-119 GiB and died; the flag's range stops it first."""
    with pytest.raises(SystemExit) as e:
        main(argv + ["--budget", "1000000000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: argument --budget:" in err and "must be at most 4096, got 1000000000" in err


def _growth(select, big: int) -> tuple[int, list, list]:
    """How much more memory ``select(B)`` allocates through Python and NumPy (``tracemalloc``
    sees NumPy's array buffers) at ``B = big`` than at ``B = 256`` (above every pool here), after an untraced warm-up;
    and both results."""
    import tracemalloc

    select(256)
    peak, got = {}, {}
    for B in (256, big):
        tracemalloc.start()
        try:
            got[B] = select(B)
            peak[B] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return peak[big] - peak[256], got[256], got[big]


def _library_problem():
    from engine_banks import make_bank

    import numpy as np

    banks = [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5),
             make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20)]
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(8, banks[0].unit_vecs.shape[1])).astype(np.float32)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    return banks, ["odd", "wide"] * 4, [f"when did we talk about {i}?" for i in range(8)], Z


def test_huge_budgets_in_the_library_are_capped_by_the_pool():
    """A library caller's B is bounded (``QueryParams``: at most ``MAX_BUDGET``, a clear error
    above); at that bound the reference selection takes the whole pool and allocates nothing
    that grows with B."""
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.params import MAX_BUDGET, QueryParams
    from trawmem_gpu.select.reference import select_reference

    with pytest.raises(ConfigError, match=r"^`budget` must lie in \[1, 4096\] \(got 1000000000\)"):
        QueryParams(budget=1_000_000_000)
    banks, ids, qs, Z = _library_problem()
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    grown, small, huge = _growth(lambda B: [select_reference(ctx[b], q, z, None, QueryParams(budget=B)).units
                                            for b, q, z in zip(ids, qs, Z)], MAX_BUDGET)
    assert grown < (1 << 20) and huge == small


def test_huge_budgets_on_the_batched_engine():
    """The batched engine (compiled, the CPU default) at the largest budget: the same picks as
    at B = 256 (both take the whole pool), and no memory that grows with B (buffers are sized by
    the candidate pool)."""
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import MAX_BUDGET, QueryParams

    banks, ids, qs, Z = _library_problem()
    eng = SelectionEngine(banks, None, device="cpu")
    grown, small, huge = _growth(lambda B: eng.select_units(ids, qs, Z, params=QueryParams(budget=B)), MAX_BUDGET)
    assert huge == small
    assert grown < (1 << 20), grown


@pytest.mark.parametrize("bad, what", [("ana\u200bben", "U+200B"), ("ana\u202eben", "U+202E"),
                                       ("\ufeffana", "U+FEFF"), ("ana\u2066x\u2069", "U+2066"),
                                       ("cafe\u0301", "NFC")])
def test_ids_that_look_alike_are_refused(bad, what):
    """Bank and turn ids cannot differ from another only by an invisible or bidirectional
    character, or by NFC / NFD form (issue 23): the one id rule refuses them, naming the field."""
    from trawmem_gpu.data.fields import id_field
    from trawmem_gpu.memory.banks import check_bank_id

    for check in (lambda: id_field(bad, "bank_id", "line 1"), lambda: check_bank_id(bad)):
        with pytest.raises(InputError, match=re.escape(what)):
            check()
    assert id_field("caf\u00e9", "bank_id", "line 1") == "caf\u00e9"  # NFC, visible: fine
