"""``train-affinity`` refuses degenerate fits, and ``--affinity-weights`` refuses their files."""
from __future__ import annotations

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.errors import InputError

from history_files import cache  # noqa: F401 - cache: an autouse fixture


def test_degenerate_affinity_weights_refused(tmp_path, capsys):
    from trawmem_gpu.head.relevance import fit_relevance, load_weights, save_weights
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    for c in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as e:
            main(["train-affinity", "--data", "D", "--out", str(tmp_path / "w.json"), "--C", c])
        assert e.value.code == 2 and "argument --C" in capsys.readouterr().err
    assert not (tmp_path / "w.json").exists()
    with pytest.raises(ValueError, match="C must be"):
        fit_relevance([object()], C=0.0)
    n = len(RELEVANCE_FEATURES)
    with pytest.raises(InputError, match="carries no signal"):
        load_weights(save_weights(tmp_path / "z.json", [0.0] * n + [-1.5], {"C": 1.0}))
    with pytest.raises(InputError, match="C = -1"):
        load_weights(save_weights(tmp_path / "n.json", [9e15] * n + [1.0], {"C": -1.0}))
    assert load_weights(save_weights(tmp_path / "ok.json", [0.5] * n + [-1.0], {"C": 1.0}))[0] == 0.5
