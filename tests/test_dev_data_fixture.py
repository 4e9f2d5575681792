"""The dev-data fixtures: a missing file skips a test with a one-line reason naming
``TRAWMEM_DEV_DATA`` on a newcomer's clone, and fails it under CI, which always has the data."""
import pytest
from dev_data_files import need_dev_data


@pytest.mark.parametrize("name", ["locomo", "longmemeval"])
def test_missing_dev_data_skips_outside_ci(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_DEV_DATA", str(tmp_path))  # a data folder holding neither file
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as e:
        need_dev_data(name)
    msg = str(e.value)
    assert "TRAWMEM_DEV_DATA" in msg and "\n" not in msg


@pytest.mark.parametrize("ci", ["true", "1"])
def test_missing_dev_data_fails_under_ci(ci, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_DEV_DATA", str(tmp_path / "nowhere.json"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="TRAWMEM_DEV_DATA"):
        need_dev_data("locomo")


def test_present_dev_data_is_returned(tmp_path, monkeypatch):
    f = tmp_path / "locomo" / "locomo_dev.json"
    f.parent.mkdir()
    f.write_text("[]")
    monkeypatch.setenv("TRAWMEM_DEV_DATA", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    assert need_dev_data("locomo") == f
