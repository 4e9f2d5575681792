"""``python -m benchmarks run scale --quick``'s machinery on the smallest sizes: every part runs
in its child processes and writes what the figure and the targets read (no timing is asserted)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_scale_run_writes_every_part(tmp_path, dev_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    r = subprocess.run([sys.executable, "-m", "benchmarks", "run", "scale", "--quick", "--parts", "writes,opening,many,query",
                        "--data", str(dev_path),
                        "--write-sizes", "90,160", "--repeats", "1", "--engine-max-units", "90", "--open-banks", "6",
                        "--many-banks", "14", "--hot", "3", "--rounds", "12", "--cold-every", "3", "--budget-mb", "0.3",
                        "--work", str(tmp_path), "--out-dir", str(tmp_path / "out")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert (tmp_path / "out" / "scale.png").exists()
    rows = rec["writes"]["rows"]
    assert [x["n_units"] for x in rows] == [90, 160] and all("error" not in x for x in rows), rows
    small = rows[0]
    assert small["select_sees_append"] and small["append_memory"]["engine_s"] > 0
    assert small["segment_units"] == [1] and small["forget_store"]["total_s"] > 0 and small["compact_s"] > 0
    assert "total_s" in rec["writes"]["model"]["append_store"]
    assert {x["mode"] for x in rec["opening"]} == {"eager", "lazy"} and all("error" not in x for x in rec["opening"])
    many = rec["many"]
    assert "error" not in many, many
    assert many["banks"] == 14 and many["evicted"] > 0 and many["cold_ms"]["n"] > 0 and many["hot_p99_ratio"] > 0
    assert rec["query"]["available"] in (True, False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("trawmem-bench-scale-")]  # the banks are gone
