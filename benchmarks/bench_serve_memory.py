"""The serving process's memory and latency against the number of distinct (B, H, T) its requests
ask for: one server per source tree (``--src``, e.g. this tree and a checkout from before per-call
query parameters), on the same collection, answering first one (B, H, T) and then 12 distinct ones.

Per tree: the server's resident memory (``VmRSS``) after start-up and warm-up, after requests
with one (B, H, T), and after requests with 12 distinct ones; the engine builds the server
reports (``trawmem_engine_builds``); the median latency of the first request of each new
(B, H, T) and of a repeated one. Servers run one after another, each on a fresh process.

    python -m benchmarks run serve_memory --collection banks/ --src . --src ../base \
        --extra-for "../base=--max-engines 12"

(the tree before per-call parameters has ``--max-engines``; this tree's server refuses it: one
engine per collection). Writes ``serve_memory.json`` and ``serve_memory.png`` (``--out``, or
``TRAWMEM_BENCH_OUT``).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import harness

CELLS = [{"budget": b, "hops": h} for b in (4, 8, 16) for h in (0, 1, 2)] + \
        [{"token_budget": t, "hops": 1} for t in (400, 800, 1600)]
"""12 distinct (B, H, T); the first is also the 'one (B, H, T)' case."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def run_tree(src: Path, collection: Path, bank_ids: list[str], threads: int, extra: list[str]) -> dict:
    import httpx

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(src.resolve()), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-c", "from trawmem_gpu.cli import main; raise SystemExit(main())", "serve",
           "--collection", str(collection.resolve()), "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads),
           *extra]
    proc = subprocess.Popen(cmd, env=env, cwd=src.resolve(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # cwd: ``-c`` puts it first on sys.path
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            t0 = time.monotonic()
            while True:  # bounded wait for readiness
                if proc.poll() is not None:
                    raise RuntimeError(f"server from {src} exited: {proc.stderr.read()[-2000:]}")
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() - t0 > 600:
                    raise RuntimeError("server not ready after 600 s")
                time.sleep(0.2)
            out = {"src": str(src), "rss_start_mib": _rss_mib(proc.pid)}
            q = "What did they plan for the weekend?"

            def ask(cell, bank):
                t = time.perf_counter()
                r = c.post("/v1/select", json={"bank_id": bank, "question": q, **cell})
                r.raise_for_status()
                return (time.perf_counter() - t) * 1e3

            for b in bank_ids:  # one (B, H, T)
                ask(CELLS[0], b)
            out["rss_one_mib"] = _rss_mib(proc.pid)
            first, again = [], []
            for cell in CELLS[1:]:
                first.append(ask(cell, bank_ids[0]))
                again.append(ask(cell, bank_ids[0]))
                for b in bank_ids[1:]:
                    ask(cell, b)
            out["rss_twelve_mib"] = _rss_mib(proc.pid)
            out["first_request_ms"] = sorted(first)[len(first) // 2]
            out["repeat_request_ms"] = sorted(again)[len(again) // 2]
            out["engine_builds"] = _metric(c.get("/metrics").text, "trawmem_engine_builds")
            return out
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def plot(res: dict):
    fig, ax = harness.figure(figsize=(7, 4))
    names = [Path(r["src"]).name or r["src"] for r in res["trees"]]
    x = range(len(names))
    for k, (key, lab) in enumerate((("rss_start_mib", "started"), ("rss_one_mib", "1 (B, H, T)"),
                                    ("rss_twelve_mib", "12 (B, H, T)"))):
        ax.bar([i + 0.27 * (k - 1) for i in x], [r[key] for r in res["trees"]], width=0.27, label=lab)
    ax.set_xticks(list(x), [f"{n}\n{r['engine_builds']:.0f} engine builds" for n, r in zip(names, res["trees"])])
    ax.set_ylabel("server resident memory (MiB)")
    ax.set_title(f"trawmem serve: {res['n_banks']} banks, {res['n_units']} units")
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collection", required=True, help="a bank collection (trawmem build --out)")
    ap.add_argument("--src", action="append", required=True, help="source tree to serve from (repeat)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    ap.add_argument("--extra", default="", help="extra serve flags for every tree (space-separated)")
    ap.add_argument("--extra-for", action="append", default=[],
                    help="SRC=FLAGS: extra serve flags for one tree, e.g. ../base=--max-engines 12")
    a = ap.parse_args(argv)
    from trawmem_gpu.store import Collection

    coll = Collection(Path(a.collection))
    ids = list(coll.bank_ids)
    n_units = sum(coll.load(b).n_units for b in ids)
    per = dict(x.split("=", 1) for x in a.extra_for)
    trees = [run_tree(Path(s), Path(a.collection), ids, a.threads, (a.extra + " " + per.get(s, "")).split())
             for s in a.src]
    for s, t in zip(a.src, trees):
        t["extra_flags"] = (a.extra + " " + per.get(s, "")).strip()
    res = {"cells": CELLS, "n_banks": len(ids), "n_units": n_units, "threads": a.threads, "trees": trees,
           "loadavg_1m": os.getloadavg()[0]}
    print(f"wrote {harness.save('serve_memory', res, plot(res), out_dir=a.out, dpi=120)}")
    for t in trees:
        print(f"{t['src']}: start {t['rss_start_mib']:.0f} MiB, 1 (B,H,T) {t['rss_one_mib']:.0f} MiB, "
              f"12 (B,H,T) {t['rss_twelve_mib']:.0f} MiB, engine builds {t['engine_builds']}, "
              f"first request of a new (B,H,T) {t['first_request_ms']:.1f} ms, repeated {t['repeat_request_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
