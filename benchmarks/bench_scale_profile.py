"""One long bank, profiled: build, open and select of a bank made of the LoCoMo dev conversations
repeated (``--copies 3``: the 12,009-turn bank of issue 33), each step in its own process, with its
wall time and peak resident memory (``VmHWM``).

The bank: every dev conversation's turns, copy after copy, under new turn ids
(``c{copy}-{conversation}-{turn}``), one session per (copy, conversation, session), dates shifted
by two years per (copy, conversation) block so the file never goes back in time. It is written as
JSONL into a temporary folder outside the repository (``--work``, default a fresh temp dir) and
removed afterwards unless ``--keep``: the data is never committed.

Steps (each a child process of this script, ``--worker STEP``):

* ``build``: ``trawmem build --input long.jsonl --out COLL --quiet``;
* ``open``: ``Memory(COLL)`` (the engine is built at open), then ``--queries`` selects at
  ``T = 800`` (questions of the dev set, asked of the long bank), the median per query and the
  engine's per-step timings (``SelectionEngine.last_timings``) of the last one; memory is read
  from ``/proc/self/status`` after open and after the selects, with the engine's own bytes.

    python -m benchmarks run scale-profile --copies 3            # the 12k bank: JSON in results/
    python -m benchmarks run scale-profile --copies 1 --tag 4k   # one copy (4,003 turns)
    python -m benchmarks run scale-profile --synthetic 100000 --tag 100k   # a synthetic bank of 10^5 turns

``--synthetic N``: a bank of ``N`` synthetic turns (``benchmarks/synthetic_banks.py``, d = 384)
written straight into a collection (``Collection.put``: its vectors are synthetic, so there is no
``trawmem build`` step), then opened as a ``Memory`` with a stand-in query encoder of the same id
(vectors from a hash of the text) and selected from like the long bank.

Results: ``scale_profile[_TAG].json`` (``--tag``), each step's seconds and peak RSS in MiB.
Keep a run's peak under the machine's share (``--limit-gib``: every child runs under
``prlimit --as``; default 6 GiB of address space).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # `python benchmarks/bench_scale_profile.py`
    import importlib.util as _u
    _s = _u.spec_from_file_location("benchmarks._boot", Path(__file__).resolve().parent / "_boot.py")
    _b = _u.module_from_spec(_s)
    _s.loader.exec_module(_b)
    _b.run_file(__file__)
    raise SystemExit(0)

from . import harness  # noqa: E402

STEPS = ("build", "open")


def write_long_bank(src: Path, out: Path, copies: int, bank_id: str = "long") -> dict:
    """Write the long bank's JSONL (see the module docstring); its turn and question counts."""
    from datetime import timedelta

    from trawmem_gpu.data.locomo import load_locomo

    convs = load_locomo(src)
    n, session, block = 0, 0, 0
    with open(out, "w", encoding="utf-8") as f:
        for c in range(copies):
            for conv in convs:
                shift = timedelta(days=730 * block)
                block += 1
                last = None
                for t in conv.turns:
                    if t.session != last:
                        session, last = session + 1, t.session
                    rec = {"bank_id": bank_id, "turn_id": f"c{c}-{conv.bank_id}-{t.turn_id}", "speaker": t.speaker,
                           "text": t.text, "timestamp": (t.time + shift).isoformat(), "session": session}
                    if t.caption:
                        rec["caption"] = t.caption
                    f.write(json.dumps(rec) + "\n")
                    n += 1
    return {"turns": n, "conversations": len(convs) * copies,
            "questions": [q.question for conv in convs for q in conv.questions if q.category in (1, 2, 3, 4)]}


def _status() -> dict:
    """VmRSS and VmHWM of this process, MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024.0
    return out


def synthetic_encoder(dim: int = 384, name: str = "synthetic-384"):
    """A stand-in query encoder for a synthetic collection: a unit vector seeded by a hash of the text."""
    import hashlib

    import numpy as np

    from trawmem_gpu.encode.base import Encoder

    class HashEncoder(Encoder):
        id, dim = name, 384

        def _encode_batch(self, texts, is_query):
            seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little") for t in texts]
            return np.stack([np.random.default_rng(s).standard_normal(dim) for s in seeds]).astype(np.float32)

    return HashEncoder()


def worker_write_synthetic(coll: str, units: int, qfile: str) -> dict:
    """Write one synthetic bank of ``units`` turns into ``coll`` and its questions into ``qfile``."""
    from benchmarks.synthetic_banks import make_banks, make_queries
    from trawmem_gpu.store.collection import Collection

    bank = make_banks(1, units=units, d=384, seed=5, prefix="long")[0]
    Path(qfile).write_text(json.dumps(make_queries([bank], 64, seed=6)[1]))
    Collection(coll, create=True).put(bank)
    return {"units": bank.n_units, "threads": bank.n_threads, "bank_id": bank.bank_id}


def worker_open(coll: str, questions: list[str], n_queries: int, bank: str = "long", synthetic: bool = False,
                compare_tables: bool = False) -> dict:
    """Open ``coll`` as a Memory (the engine is built at open), then select."""
    import numpy as np

    rec = {"before": _status()}
    t0 = time.perf_counter()
    from trawmem_gpu import Memory

    t_imp = time.perf_counter()
    mem = Memory(coll, create=False, **({"encoder": synthetic_encoder()} if synthetic else {}))
    t1 = time.perf_counter()
    eng = mem._core.engines.engine if hasattr(mem, "_core") else None
    rec.update(import_s=t_imp - t0, open_s=t1 - t_imp, after_open=_status())
    if eng is not None:
        rec["engine_bytes_mib"] = eng.nbytes() / 2 ** 20
        rec["table_bytes_mib"] = eng.table_nbytes() / 2 ** 20
        rec["plan"] = {"backend": eng.plan.backend, "front": eng.plan.front, "tables": bool(eng.plan.tables)}
    times, cpu, timings = [], [], {}
    for i, q in enumerate(questions[:n_queries]):
        t, c = time.perf_counter(), time.thread_time()
        mem.select(bank, q, token_budget=800)
        cpu.append(time.thread_time() - c)
        times.append(time.perf_counter() - t)
        if eng is not None:
            timings = dict(eng.last_timings)
    rec.update(select_first_s=times[0] if times else None,
               select_median_ms=1000 * float(np.median(times[1:] or times)) if times else None,
               select_cpu_median_ms=1000 * float(np.median(cpu[1:] or cpu)) if cpu else None,
               select_queries=len(times), last_timings_ms={k: 1000 * v for k, v in timings.items()},
               after_select=_status())
    if eng is not None and questions:  # the engine alone, CPU per query (the query vectors encoded first)
        from trawmem_gpu.select.params import QueryParams

        qs = questions[:n_queries]
        Z = mem._core.encoder.encode(qs, is_query=True)
        rec["engine_select_cpu_ms"] = _engine_cpu(eng, bank, qs, Z, QueryParams(token_budget=800, budget=None))
        if compare_tables:  # the same banks with every per-bank table built (the code before issue 33)
            t0 = time.perf_counter()
            full = type(eng)(eng.banks, eng.cfg, device="cpu", table_max_units=10 ** 9)
            rec["with_tables"] = {"build_s": time.perf_counter() - t0, "table_bytes_mib": full.table_nbytes() / 2 ** 20,
                                  "engine_select_cpu_ms": _engine_cpu(full, bank, qs, Z,
                                                                      QueryParams(token_budget=800, budget=None)),
                                  "after": _status()}
    return rec


def _engine_cpu(eng, bank: str, qs: list[str], Z, params) -> float:
    """Median thread-CPU milliseconds of ``eng.select_units`` per query (after one warm-up)."""
    import numpy as np

    eng.select_units([bank], qs[:1], Z[:1], params=params)
    cpu = []
    for i in range(len(qs)):
        c = time.thread_time()
        eng.select_units([bank], qs[i:i + 1], Z[i:i + 1], params=params)
        cpu.append(time.thread_time() - c)
    return 1000 * float(np.median(cpu))


def _child(args: list[str], limit_gib: float) -> tuple[dict, float, float]:
    """Run ``args`` under ``/usr/bin/time -v`` and ``prlimit``: ``(json on its last stdout line or
    {}, wall seconds, peak RSS MiB)``."""
    cmd = ["/usr/bin/time", "-v"]
    if limit_gib and shutil.which("prlimit"):
        cmd += ["prlimit", f"--as={int(limit_gib * 2 ** 30)}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd + args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = next((int(l.split(":")[1]) / 1024.0 for l in r.stderr.splitlines()
                 if "Maximum resident set size" in l), float("nan"))
    if r.returncode != 0:
        tail = "\n".join(r.stderr.splitlines()[-25:])
        raise SystemExit(f"{' '.join(args[:4])} ... failed ({r.returncode}):\n{tail}")
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), wall, peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=3, help="times the dev conversations are repeated (3: 12,009 turns)")
    ap.add_argument("--data", default=None, help="LoCoMo dev file (default: the shared dev data)")
    ap.add_argument("--work", default=None, help="folder for the JSONL and the collection (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep --work afterwards")
    ap.add_argument("--reuse", action="store_true", help="reuse a collection already built in --work (skip build)")
    ap.add_argument("--queries", type=int, default=21, help="selects after open (T = 800)")
    ap.add_argument("--limit-gib", type=float, default=6.0, help="address-space limit of every child (0: none)")
    ap.add_argument("--tag", default="", help="results file suffix: scale_profile_TAG.json")
    ap.add_argument("--label", default="", help="a label stored in the record (e.g. before / after)")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--synthetic", type=int, default=0, help="a synthetic bank of this many turns instead")
    ap.add_argument("--compare-tables", action="store_true",
                    help="also time the engine with every per-bank table built (table_max_units unbounded: the "
                         "engine before issue 33), in the same process; only for banks whose tables fit")
    ap.add_argument("--worker", choices=STEPS + ("write",), help=argparse.SUPPRESS)
    ap.add_argument("--coll", help=argparse.SUPPRESS)
    ap.add_argument("--qfile", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker == "open":
        qs = json.loads(Path(args.qfile).read_text())
        bank = "long00000" if args.synthetic else "long"
        print(json.dumps(worker_open(args.coll, qs, args.queries, bank, bool(args.synthetic), args.compare_tables)))
        return 0
    if args.worker == "write":
        print(json.dumps(worker_write_synthetic(args.coll, args.synthetic, args.qfile)))
        return 0
    src = None if args.synthetic else harness.require_data(args.data or harness.dev_data("locomo"))
    work = Path(args.work or tempfile.mkdtemp(prefix="trawmem-scale-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        jsonl, coll, qfile = work / "long.jsonl", work / "coll", work / "questions.json"
        exe = [sys.executable]
        if args.synthetic:
            rec = {"synthetic": args.synthetic, "turns": args.synthetic, "label": args.label, "steps": {}}
            if not (args.reuse and coll.exists()):
                out, wall, peak = _child(exe + ["-m", "benchmarks.bench_scale_profile", "--worker", "write",
                                                "--synthetic", str(args.synthetic), "--coll", str(coll),
                                                "--qfile", str(qfile)], args.limit_gib)
                rec["steps"]["write_synthetic"] = dict(out, wall_s=wall, peak_rss_mib=peak)
        else:
            made = write_long_bank(src, jsonl, args.copies)
            qfile.write_text(json.dumps(made["questions"]))
            rec = {"copies": args.copies, "turns": made["turns"], "label": args.label, "steps": {}}
        if not args.synthetic and not (args.reuse and coll.exists()):
            if coll.exists():
                shutil.rmtree(coll)
            trawmem = [exe[0], "-m", "trawmem_gpu.cli", "build", "--input", str(jsonl), "--out", str(coll), "--quiet"]
            _, wall, peak = _child(trawmem, args.limit_gib)
            rec["steps"]["build"] = {"wall_s": wall, "peak_rss_mib": peak}
            print(f"build: {wall:.1f} s, peak {peak:.0f} MiB", file=sys.stderr)
        out, wall, peak = _child(exe + ["-m", "benchmarks.bench_scale_profile", "--worker", "open", "--coll", str(coll),
                                        "--qfile", str(qfile), "--queries", str(args.queries),
                                        "--synthetic", str(args.synthetic)]
                                 + (["--compare-tables"] if args.compare_tables else []), args.limit_gib)
        rec["steps"]["open_select"] = dict(out, wall_s=wall, peak_rss_mib=peak)
        print(f"open: {out.get('open_s', float('nan')):.1f} s, select median {out.get('select_median_ms')} ms, "
              f"peak {peak:.0f} MiB", file=sys.stderr)
        rec["machine"] = harness.machine()
        name = "scale_profile" + (f"_{args.tag}" if args.tag else "")
        print(harness.save(name, rec, out_dir=args.out_dir))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
