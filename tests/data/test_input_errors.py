"""Odd input files (lone surrogates, invalid UTF-8, U+2028, scalar evidence) end in a one-line
input error or a counted repair, and JSONL and LoCoMo files follow one rule."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import load_jsonl, load_locomo
from trawmem_gpu.errors import InputError

from locomo_files import write_data
from cli_inputs import _err, _jsonl, _rec, cache  # noqa: F401 - cache: a fixture


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
