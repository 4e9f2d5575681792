"""Probe (issue 46 item 2): RssAnon (MiB) of one process that loads the cached 10^5-unit int8
collection's bank (as columns, or as a list: the loader patched to hand back ``list(turns)``) and
builds a one-thread CPU ``SelectionEngine`` over it; then after ``malloc_trim(0)``, then after
clearing the two caches keyed by a ``Turn`` (``workspace.unit_line``, ``date_label``).

    python benchmarks/experiments/turn_columns_engine_probe.py columns|list

Prints one ``RESULT {json}`` line (run it once per mode, alternating; the lines of a run are
saved as ``benchmarks/results/archive/turn_columns_engine_probe_1e5.json``)."""
import ctypes, gc, json, sys
from pathlib import Path
def st():
    out={}
    for l in Path("/proc/self/status").read_text().splitlines():
        if l.startswith(("RssAnon:",)): out[l.split(":")[0]]=round(int(l.split(":")[1].split()[0])/1024,1)
    return out["RssAnon"]
mode=sys.argv[1]
from trawmem_gpu.store import Collection, files
if mode=="list":
    real=files._read_turns; files._read_turns=lambda fp:(lambda t,d:(list(t),d))(*real(fp))
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from benchmarks import harness
r={"mode":mode,"start":st()}
c=Collection("/work/scratch/resident/coll_100000_t100_int8"); b=c.load(c.bank_ids[0], mmap=True); r["loaded"]=st()
with harness.pin_threads(1):
    e=SelectionEngine([b], SelectConfig(), device="cpu", threads=1, vectors=c.vectors)
r["engine"]=st()
from trawmem_gpu.select import workspace
r["unit_line_entries"]=workspace.unit_line.cache_info().currsize; r["date_label_entries"]=workspace.date_label.cache_info().currsize
gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0); r["engine_trimmed"]=st()
workspace.unit_line.cache_clear(); workspace.date_label.cache_clear(); gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
r["turn_caches_cleared_trimmed"]=st()
print("RESULT", json.dumps(r))
