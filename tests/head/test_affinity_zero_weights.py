"""``train-affinity`` refuses a regularization so strong that the fit's weights are all zero
(``--C 1e-300``): a clear error, exit status 2, no weights file."""
from __future__ import annotations

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.head.relevance import fit_relevance, load_labelled
from locomo_files import write_data


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    return write_data(tmp_path / "loc.json")


def test_a_c_that_zeroes_every_weight_is_refused(data, tmp_path, capsys):
    out = tmp_path / "w.json"
    assert main(["train-affinity", "--data", str(data), "--out", str(out), "--C", "1e-300", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "C = 1e-300 regularizes the affinity fit to zero weights" in err and "a larger C" in err
    assert not out.exists()
    qs, _ = load_labelled(data, folds=1)
    with pytest.raises(ConfigError, match="zero weights"):
        fit_relevance(qs, C=1e-300)
    w = fit_relevance(qs, C=1.0)
    assert any(abs(x) > 0 for x in w[:-1])
    assert main(["train-affinity", "--data", str(data), "--out", str(out), "--quiet"]) == 0 and out.exists()
