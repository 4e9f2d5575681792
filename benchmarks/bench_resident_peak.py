"""Peak bytes the lazy banks of a Memory hold while calls are in flight (issue 42.8): 16 banks under a
budget of 3.5 banks, four select threads and two append threads; the bytes held (every bank object
the registry or the engine holds, and the engine's tables) sampled at each load and engine refresh
and every half millisecond. Run: ``python benchmarks/bench_resident_peak.py`` (about a minute)."""
import shutil
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # WordEncoder
from word_encoder import WordEncoder
from trawmem_gpu import Memory
from trawmem_gpu.memory.resident import bank_nbytes

TOPICS = ("hiking trail mountain boots", "piano lesson music sheet", "garden tomato soil seeds",
          "kayak river paddle lake", "bread oven flour bake")

def turns(b, n=40, start=0):
    w = TOPICS[b % 5]
    return [{"turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben", "text": f"{w} note {b} {i} day {i % 3} " * 3,
             "timestamp": f"2031-03-{1 + i // 30:02d}T{10 + i % 10:02d}:{i % 60:02d}:00"} for i in range(start, start + n)]

d = Path(tempfile.mkdtemp()) / "c"
m = Memory(d, encoder=WordEncoder())
for b in range(16):
    m.add(f"b{b:02d}", turns(b))
probe = Memory(d, encoder=WordEncoder(), max_resident_bytes=10 ** 12)
for b in range(16):
    probe.select(f"b{b:02d}", "hiking", budget=4)
one = max(probe._core.resident._sizes.values())
budget = int(3.5 * one)
lazy = Memory(d, encoder=WordEncoder(), max_resident_bytes=budget)
core = lazy._core
peak = [0]
lk = threading.Lock()

def held():
    objs = {}
    for bk in list(core.registry._banks.values()) + list(core.engines.banks.values()):
        objs[id(bk)] = bk
    return sum(bank_nbytes(bk) for bk in objs.values()) + sum(core.engines.table_bytes.values())

def sample():
    try:
        v = held()
    except RuntimeError:
        return
    with lk:
        peak[0] = max(peak[0], v)

load = core.registry.coll.load
def hooked(*a, **k):
    out = load(*a, **k); sample(); return out
core.registry.coll.load = hooked
refresh = core.engines.refresh
def hrefresh(*a, **k):
    out = refresh(*a, **k); sample(); return out
core.engines.refresh = hrefresh
stop = threading.Event()
def sampler():
    while not stop.is_set():
        sample(); stop.wait(0.0005)

def sel(k):
    for i in range(40):
        b = (k * 5 + i * 3) % 16
        lazy.select(f"b{b:02d}", "note day", budget=4)

def app(k):
    for i in range(6):
        b = (k * 7 + i * 5) % 16
        lazy.add(f"b{b:02d}", turns(b, 1, 1000 + k * 100 + i))

ts = [threading.Thread(target=sel, args=(k,)) for k in range(4)] + [threading.Thread(target=app, args=(k,)) for k in range(2)]
s = threading.Thread(target=sampler); s.start()
for t in ts: t.start()
for t in ts: t.join()
stop.set(); s.join()
print(f"one bank {one} B, budget {budget} B (3.5 banks); peak while in flight {peak[0] / budget:.2f}x "
      f"(+one bank: {(budget + one) / budget:.2f}x); after {held() / budget:.2f}x; resident.total after {core.resident.total / budget:.2f}x")
shutil.rmtree(d.parent)
