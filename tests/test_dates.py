"""Date parsing through python-dateutil (trawmem_gpu.data.dates): the formats real exports use,
the day-first switch, and clear errors for what cannot be read."""
from datetime import datetime, timezone

import pytest

from trawmem_gpu.data.dates import parse_date

CASES = [
    ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56)),          # LoCoMo
    ("10:37 am on 27 June, 2023", datetime(2023, 6, 27, 10, 37)),
    ("2023/05/20 (Sat) 02:21", datetime(2023, 5, 20, 2, 21)),          # LongMemEval
    ("29.12.2023, 00:51:12", datetime(2023, 12, 29, 0, 51, 12)),       # messaging export
    ("2024-03-02T10:05:00", datetime(2024, 3, 2, 10, 5)),              # ISO 8601
    ("8 May, 2023", datetime(2023, 5, 8)),
    ("May 8, 2023", datetime(2023, 5, 8)),
]


@pytest.mark.parametrize("text,want", CASES)
def test_formats(text, want):
    assert parse_date(text) == want
    assert parse_date(f"  {text}  ") == want


def test_iso_with_zone():
    assert parse_date("2023-05-08T13:56:00Z") == datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)


def test_dayfirst_decides_ambiguous_dates_only():
    assert parse_date("01.02.2023") == datetime(2023, 1, 2)
    assert parse_date("01.02.2023", dayfirst=True) == datetime(2023, 2, 1)
    assert parse_date("29.12.2023", dayfirst=False) == parse_date("29.12.2023", dayfirst=True)


@pytest.mark.parametrize("bad,why", [
    ("", "empty"), ("   ", "empty"), ("garbage", "unparseable"), ("someday in May", "unparseable"),
    ("5", "incomplete"), ("May 2023", "incomplete"), ("next tuesday", "unparseable"), ("Tuesday", "incomplete"),
    ("2023/05/20 (Sun) 02:21", "wrong weekday"), ("2024-13-45T10:00:00", "unparseable"),
])
def test_errors_name_the_text(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_date(bad)


def test_non_string():
    with pytest.raises(ValueError, match="non-string"):
        parse_date(20230508)  # type: ignore[arg-type]
