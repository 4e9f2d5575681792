"""Date parsing through python-dateutil (trawmem_gpu.data.dates): the formats real exports use,
the day-first switch, and clear errors for what cannot be read."""
from datetime import datetime

import pytest

from trawmem_gpu.data.dates import parse_date

CASES = [
    ("2:14 pm on 9 May, 2031", datetime(2031, 5, 9, 14, 14)),          # LoCoMo style (a made-up date)
    ("11:22 am on 26 June, 2031", datetime(2031, 6, 26, 11, 22)),
    ("2031/05/13 (Tue) 04:17", datetime(2031, 5, 13, 4, 17)),          # LongMemEval style
    ("29.12.2031, 00:51:12", datetime(2031, 12, 29, 0, 51, 12)),       # messaging export
    ("2031-03-02T10:05:00", datetime(2031, 3, 2, 10, 5)),              # ISO 8601
    ("9 May, 2031", datetime(2031, 5, 9)),
    ("May 9, 2031", datetime(2031, 5, 9)),
]


@pytest.mark.parametrize("text,want", CASES)
def test_formats(text, want):
    assert parse_date(text) == want
    assert parse_date(f"  {text}  ") == want


def test_iso_with_zone():
    """A date with an offset or zone is read as its UTC time, naive, so it compares with every other."""
    assert parse_date("2031-05-09T14:14:00Z") == datetime(2031, 5, 9, 14, 14)
    assert parse_date("2031-05-09T14:14:00+05:00") == datetime(2031, 5, 9, 9, 14)
    assert parse_date("9 May 2031 14:14 -0200") == datetime(2031, 5, 9, 16, 14)
    assert parse_date("2031-05-09T14:14:00+05:00").tzinfo is None
    assert parse_date("2031-05-09T14:14:00Z") < datetime(2031, 5, 10)  # naive and parsed compare


def test_dayfirst_decides_ambiguous_dates_only():
    assert parse_date("01.02.2031") == datetime(2031, 1, 2)
    assert parse_date("01.02.2031", dayfirst=True) == datetime(2031, 2, 1)
    assert parse_date("29.12.2031", dayfirst=False) == parse_date("29.12.2031", dayfirst=True)


@pytest.mark.parametrize("text,want", [
    ("2031/03/02", datetime(2031, 3, 2)), ("2031.03.02", datetime(2031, 3, 2)), ("20310302", datetime(2031, 3, 2)),
    ("2031/05/06 10:00", datetime(2031, 5, 6, 10)), ("2031/05/13 (Tue) 04:17", datetime(2031, 5, 13, 4, 17)),
    ("2031-03-02 10:05", datetime(2031, 3, 2, 10, 5)),
])
def test_dayfirst_never_reorders_a_year_first_date(text, want):
    """Issue 26: dateutil reads 2031/03/02 as 3 February under dayfirst (Y/D/M)."""
    assert parse_date(text, dayfirst=True) == parse_date(text) == want


@pytest.mark.parametrize("bad,why", [
    ("", "empty"), ("   ", "empty"), ("garbage", "unparseable"), ("someday in May", "unparseable"),
    ("5", "incomplete"), ("May 2031", "incomplete"), ("next tuesday", "unparseable"), ("Tuesday", "incomplete"),
    ("2031/05/13 (Sun) 04:17", "wrong weekday"), ("2031-13-45T10:00:00", "unparseable"),
])
def test_errors_name_the_text(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_date(bad)


def test_non_string():
    with pytest.raises(ValueError, match="non-string"):
        parse_date(20310508)  # type: ignore[arg-type]


# -- --dayfirst through the loaders, build, update and eval -------------------------------------

def _dm_history(path, day_month_pairs):
    """A JSONL history whose timestamps are written d.m.Y (ambiguous when both are <= 12)."""
    import json

    recs = [{"bank_id": "b", "turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben",
             "text": f"message number {i} about the garden", "timestamp": f"{a:02d}.{b:02d}.2031, 10:0{i}:00"}
            for i, (a, b) in enumerate(day_month_pairs)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_dayfirst_reaches_both_loaders(tmp_path):
    import json

    from trawmem_gpu.data import load_conversations

    p = _dm_history(tmp_path / "h.jsonl", [(1, 2), (1, 2)])
    assert load_conversations(p)[0].turns[0].time.date().isoformat() == "2031-01-02"
    assert load_conversations(p, dayfirst=True)[0].turns[0].time.date().isoformat() == "2031-02-01"
    loc = tmp_path / "l.json"
    loc.write_text(json.dumps([{"sample_id": "s", "conversation": {
        "session_1_date_time": "03.04.2031", "session_1": [{"speaker": "A", "dia_id": "D1:7", "text": "hi"}]}}]))
    assert load_conversations(loc)[0].turns[0].time == datetime(2031, 3, 4)
    assert load_conversations(loc, dayfirst=True)[0].turns[0].time == datetime(2031, 4, 3)


def test_build_and_update_with_dayfirst(tmp_path, monkeypatch, capsys):
    from trawmem_gpu.cli import main
    from trawmem_gpu.store import Collection

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    h = _dm_history(tmp_path / "h.jsonl", [(1, 2), (1, 2), (5, 2), (5, 2)])
    for flag, month in (([], 1), (["--dayfirst"], 2)):
        out = tmp_path / f"o{len(flag)}"
        assert main(["build", "--input", str(h), "--out", str(out), "--quiet", *flag]) == 0
        bank = Collection(out).load("b")
        assert bank.turns[0].time.month == month
        # session by calendar day: 2 Jan / 1 Feb, then 2 May / 5 Feb -> two sessions either way
        assert [t.session for t in bank.turns] == [1, 1, 2, 2]
    capsys.readouterr()
    more = _dm_history(tmp_path / "more.jsonl", [(6, 2)])
    more.write_text(more.read_text().replace('"t0"', '"t9"'))
    assert main(["build", "--input", str(more), "--out", str(tmp_path / "o1"), "--update", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "was built with --dayfirst" in err and "run the update with --dayfirst too" in err
    assert main(["build", "--input", str(more), "--out", str(tmp_path / "o1"), "--update", "--quiet",
                 "--dayfirst"]) == 0
    assert [t.session for t in Collection(tmp_path / "o1").load("b").turns] == [1, 1, 2, 2, 3]


def test_a_date_over_the_cap_is_refused_before_it_is_parsed():
    """Every door reads dates through ``parse_date``, which refuses a text over ``MAX_DATE_CHARS``
    before dateutil sees it (quadratic: a 10 MB ``as_of`` ran for minutes), naming its length, not
    echoing it (issue 42)."""
    from trawmem_gpu.data.types import MAX_DATE_CHARS

    for text in ("1" * 5000, "9 May, 2031" + " " * 100, "x" * (MAX_DATE_CHARS + 1)):
        with pytest.raises(ValueError, match=rf"date is {len(text)} characters; the limit is {MAX_DATE_CHARS}") as e:
            parse_date(text)
        assert len(str(e.value)) < 120
    assert parse_date(("9 May, 2031 ").ljust(MAX_DATE_CHARS)) == datetime(2031, 5, 9)  # at the cap: read
