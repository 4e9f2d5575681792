"""Ingestion: LoCoMo layout and plain JSONL, every malformed case, evidence repairs, dev counts.

Every fixture writes its own small synthetic conversation into ``tmp_path``; the dev data is
only read in place (``dev_path``), never copied.
"""
from __future__ import annotations

import copy
import json
from datetime import datetime

import pytest

from trawmem_gpu.data import load_conversations, load_jsonl, load_locomo, sample_path
from trawmem_gpu.data.evidence import parse_evidence
from trawmem_gpu.data.jsonl import REQUIRED, turn_from_record
from trawmem_gpu.data.types import EvidenceRepairs
from trawmem_gpu.errors import InputError


# ----------------------------------------------------------------------------------------------
# JSONL
# ----------------------------------------------------------------------------------------------

def _rec(tid, text="hello there", ts="2024-03-02T10:00:00", bank="b1", speaker="Ana", **extra):
    return {"bank_id": bank, "turn_id": tid, "speaker": speaker, "text": text, "timestamp": ts, **extra}


def _write_jsonl(tmp_path, lines, name="hist.jsonl"):
    p = tmp_path / name
    p.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines), encoding="utf-8")
    return p


def _good_lines():
    return [_rec("t1", "Morning! I signed up for the half marathon."),
            _rec("t2", "Nice, when is it?", speaker="Ben"),
            _rec("t3", "April 21st.", ts="2024-03-02T10:05:00")]


def _raises_input(fn, *fragments):
    with pytest.raises(InputError) as ei:
        fn()
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in error message {msg!r}"
    assert "\n" not in msg
    return msg


def test_jsonl_good_file_loads(tmp_path):
    p = _write_jsonl(tmp_path, _good_lines())
    (conv,) = load_jsonl(p)
    assert conv.bank_id == "b1"
    assert [t.turn_id for t in conv.turns] == ["t1", "t2", "t3"]
    assert conv.speakers == ("Ana", "Ben")
    assert all(t.session == 1 for t in conv.turns)
    assert conv.turns[2].time == datetime(2024, 3, 2, 10, 5)
    assert conv.turns[0].timestamp == "2024-03-02T10:00:00"
    # load_conversations picks JSONL by suffix
    assert [t.turn_id for t in load_conversations(p)[0].turns] == ["t1", "t2", "t3"]


def test_jsonl_bad_json_names_file_and_line(tmp_path):
    lines = _good_lines()
    lines.insert(1, '{"bank_id": "b1", "turn_id": ')
    p = _write_jsonl(tmp_path, lines)
    _raises_input(lambda: load_jsonl(p), str(p), f"{p}:2", "bad JSON")


def test_jsonl_non_object_line(tmp_path):
    p = _write_jsonl(tmp_path, [_rec("t1"), "[1, 2, 3]"])
    _raises_input(lambda: load_jsonl(p), f"{p}:2", "JSON object")


@pytest.mark.parametrize("field", REQUIRED)
def test_jsonl_missing_field(tmp_path, field):
    lines = _good_lines()
    del lines[2][field]
    p = _write_jsonl(tmp_path, lines)
    _raises_input(lambda: load_jsonl(p), f"{p}:3", "missing field", repr(field))


def test_jsonl_required_fields_are_the_documented_ones():
    assert set(REQUIRED) == {"bank_id", "turn_id", "speaker", "text", "timestamp"}


@pytest.mark.parametrize("field", ["text", "speaker", "turn_id"])
def test_jsonl_wrong_type_field(tmp_path, field):
    lines = _good_lines()
    lines[1][field] = {"nested": 1}
    p = _write_jsonl(tmp_path, lines)
    _raises_input(lambda: load_jsonl(p), f"{p}:2", repr(field))


def test_jsonl_empty_text_without_caption_is_skipped_and_counted(tmp_path):
    lines = _good_lines()
    lines[1]["text"] = "   "
    p = _write_jsonl(tmp_path, lines)
    (conv,) = load_jsonl(p)
    assert [t.turn_id for t in conv.turns] == ["t1", "t3"] and conv.skipped_empty == 1


def test_jsonl_duplicate_turn_id(tmp_path):
    lines = _good_lines() + [_rec("t2", "again")]
    p = _write_jsonl(tmp_path, lines)
    _raises_input(lambda: load_jsonl(p), f"{p}:4", "duplicate", "'t2'", "turn_id")


def test_jsonl_same_turn_id_in_two_banks_is_fine(tmp_path):
    p = _write_jsonl(tmp_path, [_rec("t1"), _rec("t1", bank="b2")])
    convs = load_jsonl(p)
    assert [c.bank_id for c in convs] == ["b1", "b2"]


@pytest.mark.parametrize("bad", ["next tuesday", "2024-13-45T10:00:00", ""])
def test_jsonl_unparseable_date(tmp_path, bad):
    lines = _good_lines()
    lines[1]["timestamp"] = bad
    p = _write_jsonl(tmp_path, lines)
    _raises_input(lambda: load_jsonl(p), f"{p}:2", "'timestamp'")


def test_jsonl_empty_file(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("", encoding="utf-8")
    _raises_input(lambda: load_jsonl(p), str(p), "empty")
    p.write_text("\n   \n\n", encoding="utf-8")  # blank lines only
    _raises_input(lambda: load_jsonl(p), str(p), "empty")


def test_jsonl_missing_file(tmp_path):
    p = tmp_path / "nope.jsonl"
    _raises_input(lambda: load_jsonl(p), str(p), "not found")


def test_jsonl_bad_session_and_caption_types(tmp_path):
    p = _write_jsonl(tmp_path, [_rec("t1", session="one")])
    _raises_input(lambda: load_jsonl(p), f"{p}:1", "'session'")
    p = _write_jsonl(tmp_path, [_rec("t1", session=True)])
    _raises_input(lambda: load_jsonl(p), f"{p}:1", "'session'")
    p = _write_jsonl(tmp_path, [_rec("t1", caption=5)])
    _raises_input(lambda: load_jsonl(p), f"{p}:1", "'caption'")
    p = _write_jsonl(tmp_path, [_rec("t1", session=2), _rec("t2", session=1)])
    _raises_input(lambda: load_jsonl(p), f"{p}:2", "'session'", "backwards")


def test_jsonl_blank_lines_skipped_and_line_numbers_kept(tmp_path):
    lines = [_rec("t1"), "", "   ", _rec("t1")]
    p = _write_jsonl(tmp_path, lines)
    _raises_input(lambda: load_jsonl(p), f"{p}:4", "duplicate")


def test_jsonl_optional_caption(tmp_path):
    lines = [_rec("t1", "look at this", caption="a photo of a dog on a beach"),
             _rec("t2", "cute!"),
             _rec("t3", "", caption="a sunset over the sea"),  # an image with no words
             _rec("t4", "ok", caption="")]  # an empty caption is no caption
    (conv,) = load_jsonl(_write_jsonl(tmp_path, lines))
    t1, t2, t3, t4 = conv.turns
    assert t1.caption == "a photo of a dog on a beach"
    assert "a photo of a dog on a beach" in t1.embed_text() and "look at this" in t1.embed_text()
    assert t2.caption is None and "image" not in t2.embed_text()
    assert t3.caption == "a sunset over the sea" and "sunset" in t3.embed_text()
    assert t4.caption is None


def test_jsonl_session_inferred_from_calendar_day(tmp_path):
    lines = [_rec("a1", ts="2031-03-02T09:00:00"),
             _rec("a2", ts="2031-03-02T23:59:00"),
             _rec("b1", ts="2031-03-02T12:00:00", bank="other"),  # another bank: its own sessions
             _rec("a3", ts="2031-03-05T08:00:00"),
             _rec("a4", ts="2:14 pm on 5 March, 2031"),  # LoCoMo-style date, same day
             _rec("b2", ts="2031-03-09T12:00:00", bank="other"),
             _rec("a5", ts="2031-03-06T00:00:01"),
             _rec("a6", ts="2031-03-07T10:00:00+02:00")]
    convs = {c.bank_id: c for c in load_jsonl(_write_jsonl(tmp_path, lines))}
    assert [t.session for t in convs["b1"].turns] == [1, 1, 2, 2, 3, 4]
    assert [t.session for t in convs["other"].turns] == [1, 2]
    assert convs["b1"].sessions == [1, 2, 3, 4]
    assert convs["b1"].turns[3].time == datetime(2031, 3, 5, 14, 14)
    # Lines of a bank keep their file order.
    assert [t.turn_id for t in convs["b1"].turns] == ["a1", "a2", "a3", "a4", "a5", "a6"]


def test_jsonl_explicit_session_wins(tmp_path):
    lines = [_rec("a1", ts="2024-03-02T09:00:00", session=4),
             _rec("a2", ts="2024-03-03T09:00:00", session=4),  # day changes, session given: kept
             _rec("a3", ts="2024-03-03T10:00:00", session=7)]
    (conv,) = load_jsonl(_write_jsonl(tmp_path, lines))
    assert [t.session for t in conv.turns] == [4, 4, 7]


def test_sample_ships_and_loads():
    convs = load_conversations(sample_path())
    assert len(convs) >= 1 and sum(len(c.turns) for c in convs) >= 20
    assert all(len(c.sessions) >= 2 for c in convs)


# ----------------------------------------------------------------------------------------------
# LoCoMo layout
# ----------------------------------------------------------------------------------------------

def _locomo_sample(sid="conv-x"):
    return {
        "sample_id": sid,
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "2:14 pm on 9 May, 2031",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D" + "1:1", "text": "I adopted a puppy!"},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "No way, show me.",},
                {"speaker": "Ana", "dia_id": "D1:3", "text": "Here he is.", "img_url": ["http://x/y.jpg"],
                 "blip_caption": "a photo of a small brown dog on a couch"},
            ],
            "session_2_date_time": "11:22 am on 26 June, 2031",
            "session_2": [
                {"speaker": "Ben", "dia_id": "D2:1", "text": "How is the puppy?"},
                {"speaker": "Ana", "dia_id": "D2:2", "text": "Chewing everything."},
            ],
        },
        "qa": [{"question": "What did Ana adopt?", "answer": "a puppy", "evidence": ["D1:1"], "category": 4},
               {"question": "What did Ana adopt in May?", "evidence": ["D1:1"], "category": 5,
                "adversarial_answer": "a kitten"}],
    }


def _write_locomo(tmp_path, data, name="locomo.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


def test_locomo_good_sample(tmp_path):
    p = _write_locomo(tmp_path, [_locomo_sample()])
    (conv,) = load_locomo(p)
    assert conv.bank_id == "conv-x" and conv.speakers == ("Ana", "Ben")
    assert [t.turn_id for t in conv.turns] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    assert [t.session for t in conv.turns] == [1, 1, 1, 2, 2]
    assert len(conv.questions) == 2
    q0, q1 = conv.questions
    assert q0.answer == "a puppy" and q0.evidence == ("D1:1",) and q0.category == 4
    assert q1.answer is None and q1.adversarial_answer == "a kitten" and q1.category == 5
    assert load_conversations(p)[0].bank_id == "conv-x"  # auto: .json -> locomo


def test_locomo_images_as_captions(tmp_path):
    (conv,) = load_locomo(_write_locomo(tmp_path, [_locomo_sample()]))
    t = conv.turns[2]
    assert t.caption == "a photo of a small brown dog on a couch"
    assert "small brown dog" in t.embed_text() and "Here he is." in t.embed_text()
    assert all(x.caption is None for x in conv.turns[:2])


def test_locomo_session_dates_parsed(tmp_path):
    (conv,) = load_locomo(_write_locomo(tmp_path, [_locomo_sample()]))
    assert conv.turns[0].time == datetime(2031, 5, 9, 14, 14)
    assert conv.turns[0].timestamp == "2:14 pm on 9 May, 2031"
    assert conv.turns[3].time == datetime(2031, 6, 26, 11, 22)
    assert conv.turns[4].timestamp == "11:22 am on 26 June, 2031"


def test_locomo_sessions_in_numeric_order(tmp_path):
    s = _locomo_sample()
    c = s["conversation"]
    c["session_10_date_time"] = "9:00 am on 1 August, 2031"
    c["session_10"] = [{"speaker": "Ana", "dia_id": "D10:1", "text": "Later."}]
    # JSON key order puts session_10 before session_2
    conv_sorted = {k: c[k] for k in ["speaker_a", "speaker_b", "session_1_date_time", "session_1",
                                     "session_10_date_time", "session_10", "session_2_date_time", "session_2"]}
    s["conversation"] = conv_sorted
    (conv,) = load_locomo(_write_locomo(tmp_path, [s]))
    assert [t.session for t in conv.turns] == [1, 1, 1, 2, 2, 10]


def test_locomo_single_sample_object_loads(tmp_path):
    (conv,) = load_locomo(_write_locomo(tmp_path, _locomo_sample()))
    assert conv.bank_id == "conv-x"


def test_locomo_bad_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[{"sample_id": "conv-x",\n "conversation": {,}}]', encoding="utf-8")
    _raises_input(lambda: load_locomo(p), str(p), "bad JSON", "line 2")


def test_locomo_not_a_list(tmp_path):
    p = _write_locomo(tmp_path, {"hello": 1})
    _raises_input(lambda: load_locomo(p), str(p), "list of samples")


def test_locomo_no_samples(tmp_path):
    p = _write_locomo(tmp_path, [])
    _raises_input(lambda: load_locomo(p), str(p), "no samples")


def _mutated(mutate):
    good = _locomo_sample("conv-ok")
    bad = _locomo_sample("conv-x")
    mutate(bad)
    return [good, bad]


@pytest.mark.parametrize("field", ["sample_id", "conversation"])
def test_locomo_missing_sample_field(tmp_path, field):
    p = _write_locomo(tmp_path, _mutated(lambda s: s.pop(field)))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "missing field", repr(field))


@pytest.mark.parametrize("field", ["dia_id", "speaker", "text"])
def test_locomo_missing_turn_field(tmp_path, field):
    p = _write_locomo(tmp_path, _mutated(lambda s: s["conversation"]["session_2"][1].pop(field)))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "'conv-x'", "conversation.session_2[1]",
                  "missing field", repr(field))


def test_locomo_missing_session_date(tmp_path):
    p = _write_locomo(tmp_path, _mutated(lambda s: s["conversation"].pop("session_2_date_time")))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "'conv-x'", "conversation.session_2_date_time")


@pytest.mark.parametrize("field", ["question", "category"])
def test_locomo_missing_qa_field(tmp_path, field):
    p = _write_locomo(tmp_path, _mutated(lambda s: s["qa"][1].pop(field)))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "'conv-x'", "qa[1]", "missing field", repr(field))


def test_locomo_wrong_type_fields(tmp_path):
    p = _write_locomo(tmp_path, _mutated(lambda s: s["conversation"].__setitem__("session_1", "oops")))
    _raises_input(lambda: load_locomo(p), "sample 1", "'conv-x'", "conversation.session_1")
    p = _write_locomo(tmp_path, _mutated(lambda s: s.__setitem__("qa", {"a": 1})))
    _raises_input(lambda: load_locomo(p), "sample 1", "'conv-x'", "'qa'")
    p = _write_locomo(tmp_path, _mutated(lambda s: s["qa"][0].__setitem__("category", "four")))
    _raises_input(lambda: load_locomo(p), "sample 1", "qa[0]", "'category'")
    p = _write_locomo(tmp_path, _mutated(lambda s: s["conversation"]["session_1"].__setitem__(0, "turn")))
    _raises_input(lambda: load_locomo(p), "sample 1", "conversation.session_1[0]")


def test_locomo_duplicate_turn_id(tmp_path):
    p = _write_locomo(tmp_path, _mutated(lambda s: s["conversation"]["session_2"][0].__setitem__("dia_id", "D1:2")))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "'conv-x'", "conversation.session_2[0]",
                  "duplicate", "'D1:2'", "dia_id")


def test_locomo_duplicate_sample_id(tmp_path):
    p = _write_locomo(tmp_path, [_locomo_sample("conv-a"), _locomo_sample("conv-a")])
    _raises_input(lambda: load_locomo(p), str(p), "duplicate sample_id", "'conv-a'")


@pytest.mark.parametrize("bad", ["someday in May", "25:61 pm on 40 May, 2031", ""])
def test_locomo_unparseable_date(tmp_path, bad):
    p = _write_locomo(tmp_path, _mutated(lambda s: s["conversation"].__setitem__("session_2_date_time", bad)))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "'conv-x'", "conversation.session_2_date_time")


def test_locomo_empty_conversation(tmp_path):
    def empty(s):
        s["conversation"]["session_1"] = []
        s["conversation"]["session_2"] = []

    p = _write_locomo(tmp_path, _mutated(empty))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "'conv-x'", "empty conversation")

    def no_sessions(s):
        s["conversation"] = {"speaker_a": "Ana", "speaker_b": "Ben"}

    p = _write_locomo(tmp_path, _mutated(no_sessions))
    _raises_input(lambda: load_locomo(p), str(p), "sample 1", "empty conversation")


def test_locomo_empty_session_without_date_is_skipped(tmp_path):
    def add_empty(s):
        s["conversation"]["session_3"] = []  # LoCoMo has trailing empty sessions; no date needed

    (_, conv) = load_locomo(_write_locomo(tmp_path, _mutated(add_empty)))
    assert conv.sessions == [1, 2]


# ----------------------------------------------------------------------------------------------
# Evidence repairs
# ----------------------------------------------------------------------------------------------

def _evidence_sample():
    s = _locomo_sample("conv-ev")
    c = s["conversation"]
    for n, ids in ((8, ["D8:5", "D8:6"]), (9, ["D9:17"]), (11, ["D11:26"])):
        c[f"session_{n}_date_time"] = f"10:00 am on {n} July, 2031"
        c[f"session_{n}"] = [{"speaker": "Ana", "dia_id": i, "text": f"turn {i}"} for i in ids]
    c["session_1"].append({"speaker": "Ben", "dia_id": "D1:4", "text": "x"})
    c["session_1"].append({"speaker": "Ana", "dia_id": "D1:5", "text": "y"})
    q = lambda ev: {"question": "?", "answer": "a", "evidence": ev, "category": 1}
    s["qa"] = [q(["D8:6; D9:17"]),  # several ids in one string
               q(["D:11:26"]),  # stray colon
               q(["D"]),  # unparseable
               q(["D01:05"]),  # leading zeros
               q(["D30:1"]),  # names no turn
               q([]),  # empty list
               q(["D1:5"]),  # clean: no repair
               ]
    return s


EXPECTED_EVIDENCE = [("D8:6", "D9:17"), ("D11:26",), (), ("D1:5",), (), (), ("D1:5",)]


def test_evidence_repairs_counted_on_synthetic_sample(tmp_path):
    (conv,) = load_locomo(_write_locomo(tmp_path, [_evidence_sample()]))
    assert [q.evidence for q in conv.questions] == EXPECTED_EVIDENCE
    assert conv.repairs.as_dict() == {"multi_id_strings": 1, "normalized_ids": 2, "dropped_unknown": 1,
                                      "dropped_unparseable": 1, "empty_lists": 1}


@pytest.mark.parametrize("raw, evidence, counter", [
    (["D8:6; D9:17"], ("D8:6", "D9:17"), "multi_id_strings"),
    (["D:11:26"], ("D11:26",), "normalized_ids"),
    (["D"], (), "dropped_unparseable"),
    (["D01:05"], ("D1:5",), "normalized_ids"),
    (["D30:1"], (), "dropped_unknown"),
    ([], (), "empty_lists"),
    (None, (), "empty_lists"),
    ("D1:5", ("D1:5",), None),
    (["D1:5"], ("D1:5",), None),
])
def test_each_evidence_repair_alone(raw, evidence, counter):
    known = {"D8:6", "D9:17", "D11:26", "D1:5"}
    r = EvidenceRepairs()
    assert parse_evidence(copy.deepcopy(raw), known, r) == evidence
    counts = r.as_dict()
    expected = {k: 0 for k in counts}
    if counter:
        expected[counter] = 1
    assert counts == expected


def test_evidence_never_crashes_on_odd_values():
    r = EvidenceRepairs()
    for raw in ([None], [5], [["D1:5"]], ["", "   "], ["d1:5"], [{"x": 1}]):
        parse_evidence(raw, {"D1:5"}, r)
    assert sum(r.as_dict().values()) >= 1


def test_repairs_add():
    a, b = EvidenceRepairs(multi_id_strings=1), EvidenceRepairs(multi_id_strings=2, empty_lists=3)
    a.add(b)
    assert a.multi_id_strings == 3 and a.empty_lists == 3


# ----------------------------------------------------------------------------------------------
# The dev file
# ----------------------------------------------------------------------------------------------

def test_dev_file_counts(dev_path):
    convs = load_locomo(dev_path)
    assert len(convs) == 7
    assert sum(len(c.turns) for c in convs) == 4003
    # The dev split holds 7 of locomo10's 10 conversations: 1,361 questions (1,986 is the figure
    # for all 10), of which 318 are category 5 (adversarial).
    qs = [q for c in convs for q in c.questions]
    assert len(qs) == 1361
    assert sum(q.category == 5 for q in qs) == 318
    assert all(q.answer is not None for q in qs if q.category != 5)
    for c in convs:
        ids = {t.turn_id for t in c.turns}
        assert len(ids) == len(c.turns)
        assert all(e in ids for q in c.questions for e in q.evidence)
        assert all(t.time is not None for t in c.turns)
        sess = [t.session for t in c.turns]
        assert sess == sorted(sess)
    assert sum(1 for c in convs for t in c.turns if t.caption) > 0
    total = EvidenceRepairs()
    for c in convs:
        total.add(c.repairs)
    assert sum(total.as_dict().values()) > 0  # the dev data has dirty ids; they are counted


def test_record_of_is_what_the_loader_reads_back():
    """``record_of`` (what ``Memory.add`` and the client send) gives the record a turn came from."""
    from trawmem_gpu.data.jsonl import record_of

    for rec in (_rec("t1"), _rec("t2", caption="a photo of a boat"), {**_rec("t3"), "session": 4}):
        _, turn = turn_from_record(rec)
        back = record_of(turn, bank_id="b1")
        assert turn_from_record({**back, "bank_id": "b1"}) == ("b1", turn)
        assert record_of(rec, bank_id="b1") == {k: v for k, v in rec.items() if k != "bank_id"}
    with pytest.raises(InputError, match=r"turns\[2\]\.bank_id: 'b1' is not the bank"):
        record_of(_rec("t1"), "turns[2]", "b9")
    with pytest.raises(InputError, match="turns: expected a dict or an object with turn_id"):
        record_of(object(), "turns")
