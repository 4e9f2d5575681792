"""The benchmark harness (``benchmarks/harness.py``): result files, data paths, thread pinning."""
import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks import harness


def test_save_writes_json_and_png_with_machine_and_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_x.py", "--rounds", "2"])
    fig, ax = harness.figure(1, 1)
    ax.plot([0, 1], [1, 0])
    p = harness.save("bench_x", {"rows": [1, 2], "value": 0.5}, fig, out_dir=tmp_path)
    rec = json.loads(p.read_text())
    assert p == tmp_path / "bench_x.json"
    assert rec["rows"] == [1, 2] and rec["value"] == 0.5
    assert rec["command"].endswith("bench_x.py --rounds 2")
    assert rec["machine"]["cpu_count"] == os.cpu_count() and "platform" in rec["machine"]
    assert (tmp_path / "bench_x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    umask = os.umask(0)
    os.umask(umask)
    for f in ("bench_x.json", "bench_x.png"):  # as a plain write would create them, not private
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o666 & ~umask
    # nothing but the two results and their lock files is left behind (the temporary files were renamed)
    assert sorted(f.name for f in tmp_path.iterdir() if f.name != ".locks") == ["bench_x.json",
                                                                                          "bench_x.png"]


def test_save_keeps_a_record_s_own_machine_and_command(tmp_path):
    p = harness.save("own", {"machine": {"kind": "given"}, "command": "python x.py"}, out_dir=tmp_path)
    rec = json.loads(p.read_text())
    assert rec["machine"] == {"kind": "given"} and rec["command"] == "python x.py"


def test_save_serializes_numpy_values(tmp_path):
    np = pytest.importorskip("numpy")
    p = harness.save("np", {"x": np.float32(0.25), "v": np.arange(3)}, out_dir=tmp_path)
    rec = json.loads(p.read_text())
    assert rec["x"] == 0.25 and rec["v"] == [0, 1, 2]


def test_a_write_that_fails_halfway_leaves_the_old_file(tmp_path):
    harness.save("keep", {"v": 1}, out_dir=tmp_path)

    def half(tmp):
        Path(tmp).write_text('{"v": 2, "trunc')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        harness._write_atomic(tmp_path / "keep.json", half)
    assert json.loads((tmp_path / "keep.json").read_text())["v"] == 1
    assert sorted(f.name for f in tmp_path.iterdir() if f.name != ".locks") == ["keep.json"]


def test_locked_read_modify_write_keeps_earlier_parts(tmp_path):
    harness.save("merged", {"part_a": 1}, out_dir=tmp_path)
    with harness.locked("merged", tmp_path) as old:
        old.update({"part_b": 2})
        harness.save("merged", old, out_dir=tmp_path)  # re-enters the held lock instead of waiting on it
    rec = json.loads((tmp_path / "merged.json").read_text())
    assert rec["part_a"] == 1 and rec["part_b"] == 2
    with harness.locked("absent", tmp_path) as old:
        assert old == {}


def test_results_dir_follows_the_env_then_the_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_BENCH_OUT", str(tmp_path / "env"))
    assert harness.results_dir() == tmp_path / "env" and (tmp_path / "env").is_dir()
    assert harness.results_dir(tmp_path / "arg") == tmp_path / "arg"
    assert harness.out_file(None, "a.json") == tmp_path / "env" / "a.json"
    monkeypatch.delenv("TRAWMEM_BENCH_OUT")
    assert harness.results_dir() == harness.RESULTS


def test_dev_data_from_a_file_a_folder_or_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAWMEM_DEV_DATA", raising=False)
    assert harness.dev_data("locomo") == harness.SHARED_DATA / "locomo" / "locomo_dev.json"
    monkeypatch.setenv("TRAWMEM_DEV_DATA", str(tmp_path))  # a folder laid out like ../shared/data
    assert harness.dev_data("longmemeval") == tmp_path / "longmemeval" / "longmemeval_s_dev.json.gz"
    f = tmp_path / "mine.json"
    f.write_text("[]")
    monkeypatch.setenv("TRAWMEM_DEV_DATA", str(f))  # the LoCoMo file, as the tests take it
    assert harness.dev_data("locomo") == f
    assert harness.dev_data("longmemeval") == harness.SHARED_DATA / "longmemeval" / "longmemeval_s_dev.json.gz"
    with pytest.raises(ValueError, match="name"):
        harness.dev_data("nope")


def test_missing_data_is_a_one_line_error_with_status_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_x.py"])
    with pytest.raises(SystemExit) as e:
        harness.require_data(tmp_path / "absent.json", "longmemeval", "--lme")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LongMemEval-S dev data not found" in err and "--lme" in err
    assert harness.require_data(tmp_path) == tmp_path


def test_pin_threads_holds_and_restores_torch_and_the_environment(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("threadpoolctl")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    before = torch.get_num_threads()
    numba_env = os.environ.get("NUMBA_NUM_THREADS")
    with harness.pin_threads(1):
        import numba

        assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
        assert all(os.environ[k] == "1" for k in harness.THREAD_VARS if k != "NUMBA_NUM_THREADS")
        assert os.environ.get("NUMBA_NUM_THREADS") == numba_env  # numba re-reads it at every compile
    assert torch.get_num_threads() == before
    assert "OMP_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "7"
    with pytest.raises(ValueError, match="threads"):
        with harness.pin_threads(0):
            pass


def test_numba_compiles_inside_pin_threads_after_its_pool_started():
    """numba re-reads NUMBA_NUM_THREADS at each compile and refuses a value other than the pool it
    launched: a block that pins threads must leave the variable alone (a suite-order failure once)."""
    numba = pytest.importorskip("numba")
    numba.get_num_threads()  # the pool starts at its default size
    with harness.pin_threads(1):
        f = numba.njit(lambda x: x + 1)
        assert f(1) == 2


def test_command_is_relative_to_the_repository(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(harness.HERE / "bench_select.py"), "--versus", "a b"])
    assert harness.command() == "python benchmarks/bench_select.py --versus 'a b'"


def test_tests_module_loads_a_test_helper_by_file():
    mod = harness.tests_module("llm_server")
    assert hasattr(mod, "LLMServer") and Path(mod.__file__).parent.name == "support"
