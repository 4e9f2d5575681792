"""``train-affinity`` on data it cannot fit, its fit options, and a diverging fit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.errors import InputError

from locomo_files import write_data
from cli_inputs import _jsonl, _rec, cache  # noqa: F401 - cache: a fixture


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
