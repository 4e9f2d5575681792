"""Numeric options have ranges, checked at parse time."""
from __future__ import annotations

import pytest

from trawmem_gpu.cli import main

from history_files import cache  # noqa: F401 - cache: an autouse fixture


@pytest.mark.parametrize("argv", [
    ["query", "--bank", "B", "--question", "q", "--hops", "1000000000"],
    ["score", "--data", "D", "--out", "o", "--hops", "9"],
    ["eval", "--data", "D", "--output", "o", "--hops", "1000000000"],
    ["sweep", "--data", "D", "--hops", "1,1000000000"],
    ["serve", "--max-hops", "99"],
    ["query", "--bank", "B", "--question", "q", "--budget", "100000000"],
    ["score", "--data", "D", "--out", "o", "--token-budget", "10000000000"],
    ["serve", "--port", "70000"],
    ["serve", "--max-wait-ms", "nan"],
    ["train-head", "--data", "D", "--out", "o", "--lr", "-1"],
    ["train-head", "--data", "D", "--out", "o", "--epochs", "0"],
])
def test_numeric_ranges_at_parse_time(argv, capsys, monkeypatch):
    import trawmem_gpu.encode as enc

    monkeypatch.setattr(enc, "get_encoder", lambda *a, **k: pytest.fail("loaded a model before checking flags"))
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {argv[-2]}" in err and "must be" in err, err
