"""Load test of `trawmem serve`: the real server on 127.0.0.1 under N concurrent clients.

Servers: one ``trawmem serve`` subprocess per configuration, all started up front on free ports
(each over its own copy of the collection, since appends write to it): dynamic batching with
``--max-batch 64`` and each ``--max-wait-ms`` of ``--waits``, and batch-size-1 serving
(``--max-batch 1``). Clients: ``--conc`` closed-loop clients (keep-alive HTTP/1.1 connections
on one asyncio loop, requests serialized in advance, so the load generator costs tens of
microseconds per request), each sending the next dev question as soon as its previous answer
came back, for ``--duration`` seconds per cell (bounded in time and in count by
``--max-requests``), while one append client adds a turn to a random bank every
``--append-every`` seconds. Cells (server x concurrency) run in ``--rounds`` rounds, alternating
servers within a round; figures are medians over rounds.

First, the query encoder's CPU time per question one at a time and in chunks of 8-64 (the
ceiling of what batching can gain on this CPU). Per cell: throughput, p50 / p95 / p99 latency,
failed requests (must be 0), the mean batch size (per batch, from the answers'
``timings.batch_size``), how busy the server's batch worker was (its batch seconds from
``/metrics`` over the cell's wall time), and the server's CPU per query by thread role (event
loop = HTTP, batch worker = encoder + engine, assembly, appends; from ``/proc``). Around each
cell, in this process, the in-process rate at that cell's batch size: ``encoder.encode`` +
``SelectionEngine.select_units`` on batches of that size (the same banks, config and threads),
half measured before the cell and half after; the ratio served / in-process is taken within the
cell, and dynamic batching over batch-size-1 within each round. At the end: turns appended
(answered 200) against turns stored (the servers' ``GET /v1/banks`` and the collections reloaded
from disk), which must match.

"Where the time goes" runs the reference server (``--ref-wait``, the default 5 ms) at
``--where-conc`` clients with client-supplied ``question_vector`` s (no encoder), once per request
(``/v1/select``) and once in ``/v1/select/batch`` calls of ``--batch-call`` requests: the
server's CPU per query by thread role, the worker's busy fraction, and a request's latency split
into queueing, the batch's engine call, assembly and HTTP (client latency minus the server's own
time). The batch-size-1 server takes the same ``/v1/select`` vector cells beside it in each round:
dynamic batching over batch-size-1 serving without the encoder. So does a server configured as
the reference one with each ``--http-workers N`` (HTTP in N front processes, one engine process;
its CPU per query adds a ``fronts`` role). With ``--baseline-src DIR`` (a source tree of an earlier version, e.g. ``git archive COMMIT |
tar -x -C DIR`` and ``ln -s ../kernels DIR/trawmem_gpu/kernels``) a server of that tree, configured as the reference one, runs the same cells,
alternating with it in each round: this version over that one, per round, in one run.

    python benchmarks/bench_serve.py [--quick] [--duration 4] [--rounds 4] [--waits 0,5,20]
                                     [--conc 1,8,64,256] [--threads 1] [--data PATH|sample]
                                     [--encoder-runtime torch|onnx] [--baseline-src DIR] [--skip-text]

Results: ``benchmarks/results/serve.json`` and ``serve.png`` (or ``--out-dir``, ``--name``). Dev data is read
in place (``../shared/data/locomo/locomo_dev.json``); ``--data sample`` uses 8 copies of the
bundled sample conversation instead.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def load_data(spec: str):
    """(collection dir to copy, banks, [(bank_id, question)])."""
    from trawmem_gpu.config import BuildConfig

    if spec == "sample":
        from trawmem_gpu.construct import build_banks
        from trawmem_gpu.data import load_conversations, sample_path
        from trawmem_gpu.store import Collection

        base = load_conversations(sample_path())[0]
        convs = [replace(base, bank_id=f"sample-{i}") for i in range(8)]
        banks, _ = build_banks(convs, BuildConfig(), progress=False)
        d = Path(tempfile.mkdtemp(prefix="trawmem-bench-src-"))
        coll = Collection(d, create=True)
        for b in banks:
            coll.put(b)
        qs = json.loads((sample_path().parent / "sample_questions.json").read_text())
        items = [(b.bank_id, q["question"]) for b in banks for q in qs]
        return d, banks, items
    from trawmem_gpu.eval.retrieval import banks_for

    convs, banks, cdir = banks_for(spec, BuildConfig(), progress=False)
    items = [(c.bank_id, q.question) for c in convs for q in c.questions if q.category in (1, 2, 3, 4)]
    return Path(cdir), banks, items


# ----------------------------------------------------------------------------------------------
# servers
# ----------------------------------------------------------------------------------------------
class Server:
    def __init__(self, name: str, src: Path, work: Path, args, max_batch: int, max_wait_ms: float,
                 root: Path = ROOT, http_workers: int = 0):
        """``root``: the source tree the server runs from (this one, or ``--baseline-src``);
        ``http_workers``: its ``--http-workers`` (front processes)."""
        self.name, self.max_batch, self.max_wait_ms = name, max_batch, max_wait_ms
        self.http_workers = http_workers
        self._children: list[int] | None = None
        self.coll = work / f"coll-{name}"
        shutil.copytree(src, self.coll)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / f"server-{name}.log", "w")
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "TRAWMEM_ENCODER_RUNTIME": args.encoder_runtime,
               "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
               "NUMBA_NUM_THREADS": str(args.threads)}
        cmd = [sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(self.coll), "--port",
               str(self.port), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms),
               "--max-queue", "4096", "--timeout", "120", "--threads", str(args.threads),
               "--switch-interval-ms", str(args.switch_interval_ms), "--encode-chunk", str(args.encode_chunk)]
        if http_workers:
            cmd += ["--http-workers", str(http_workers)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(root))

    def wait_ready(self, timeout: float = 600.0) -> None:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    self.children()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server {self.name} not ready after {timeout} s")

    def children(self) -> list[int]:
        """Pids of the server's child processes (its HTTP fronts, with ``--http-workers``), read
        from ``/proc`` once, when the server is ready (they do not change while it runs)."""
        if self._children is not None:
            return self._children
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                        out.append(int(d.name))
                except (OSError, IndexError, ValueError):
                    continue
        self._children = out
        return out

    @staticmethod
    def _proc_cpu(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def cpu_seconds(self) -> float:
        """CPU seconds so far of the server, its front processes included."""
        return self._proc_cpu(self.proc.pid) + sum(self._proc_cpu(c) for c in self.children())

    def thread_cpu(self) -> dict[str, float]:
        """CPU seconds so far of the server's threads by role: the event loop (main thread: HTTP,
        validation, batching; with front processes, the engine side of the socket and batching),
        the batch worker (encoder + engine), workspace assembly, appends, the rest (torch / numba
        pools, Python helpers) and the HTTP front processes (``fronts``)."""
        roles = {"tm-batch": "worker", "tm-assemble": "assembly", "tm-append": "append"}
        out = dict.fromkeys(("event_loop", "worker", "assembly", "append", "other", "fronts"), 0.0)
        out["fronts"] = sum(self._proc_cpu(c) for c in self.children())
        tick = os.sysconf("SC_CLK_TCK")
        for t in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                comm = (t / "comm").read_text().strip()
                parts = (t / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            role = "event_loop" if t.name == str(self.proc.pid) else roles.get(comm, "other")
            out[role] += (int(parts[11]) + int(parts[12])) / tick
        return out

    def busy_seconds(self) -> tuple[float, float]:
        """(batch worker seconds, workspace assembly seconds) so far, from /metrics."""
        import httpx

        w = a = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith('trawmem_batch_seconds_sum{stage="total"}'):
                w = float(line.split()[-1])
            elif line.startswith("trawmem_assemble_seconds_sum"):
                a = float(line.split()[-1])
        return w, a

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # graceful: drains
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ----------------------------------------------------------------------------------------------
# load
# ----------------------------------------------------------------------------------------------
class Conn:
    """One keep-alive HTTP/1.1 connection with requests serialized in advance: a load generator
    that costs a few tens of microseconds per request, so the clients are not what is measured
    (an httpx client costs ~10x more CPU per request, on the same two cores as the server)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.r = self.w = None

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port)
        self.w.write(head + body)
        line = await self.r.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        status = int(line.split(b" ", 2)[1])
        length, close = 0, False
        while True:
            h = await self.r.readline()
            if h in (b"\r\n", b""):
                break
            k, _, v = h.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"connection" and v.strip().lower() == b"close":
                close = True
        data = await self.r.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self):
        if self.w is not None:
            self.w.close()
            self.r = self.w = None


def _head(path: str, port: int, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()


async def _load(url: str, bodies: list[bytes], route: str, conc: int, duration: float, max_requests: int,
                warmup: float, append_every: float, bank_ids: list[str], tag: str) -> dict:
    port = int(url.rsplit(":", 1)[1])
    reqs = [(_head(route, port, b), b) for b in bodies]
    lat, answers, failures = [], [], []
    appended, append_fail, append_ms = [], [], []
    state = {"next": random.randrange(len(bodies)), "sent": 0, "done": 0}
    t_begin = time.perf_counter()
    t_meas, t_end = t_begin + warmup, t_begin + warmup + duration
    cpu0 = time.process_time()

    async def client():
        conn = Conn("127.0.0.1", port)
        try:
            while True:
                if time.perf_counter() >= t_end or state["sent"] >= max_requests:
                    return
                i = state["next"]
                state["next"] = (i + 1) % len(reqs)
                t0 = time.perf_counter()
                if t0 >= t_meas:
                    state["sent"] += 1
                try:
                    status, data = await conn.request(*reqs[i])
                    ok = status == 200
                except Exception as e:  # noqa: BLE001 - every failure is counted
                    ok, data = False, repr(e).encode()
                    await conn.close()
                t1 = time.perf_counter()
                state["done"] += ok
                if t0 < t_meas:
                    continue
                if ok:
                    lat.append(t1 - t0)
                    answers.append(data)
                else:
                    failures.append(data[:200].decode(errors="replace"))
        finally:
            await conn.close()

    async def appender():
        conn, k = Conn("127.0.0.1", port), 0
        try:
            while time.perf_counter() < t_end:
                await asyncio.sleep(append_every)
                if time.perf_counter() >= t_end:
                    return
                b = random.choice(bank_ids)
                turn = {"turn_id": f"bench-{tag}-{k}", "speaker": "Bench", "timestamp": "2031-01-01T10:00:00",
                        "text": f"Bench note {k}: we planned a trip to the lake and bought a kayak."}
                k += 1
                body = json.dumps({"turns": [turn]}).encode()
                try:
                    ta = time.perf_counter()
                    status, data = await conn.request(_head(f"/v1/banks/{b}/turns", port, body), body)
                    (appended if status == 200 else append_fail).append(status)
                    if status == 200:  # the append's own timings, and how long its client waited
                        tm = json.loads(data).get("timings", {})
                        append_ms.append((tm.get("build_and_write_ms"), tm.get("engine_refresh_ms"),
                                          (time.perf_counter() - ta) * 1e3))
                except Exception as e:  # noqa: BLE001
                    append_fail.append(repr(e))
                    await conn.close()
        finally:
            await conn.close()

    tasks = [asyncio.create_task(client()) for _ in range(conc)]
    if append_every > 0:
        tasks.append(asyncio.create_task(appender()))
    await asyncio.gather(*tasks)
    wall = min(time.perf_counter(), t_end) - t_meas
    return {"lat": lat, "answers": [json.loads(a) for a in answers], "failures": failures, "wall": max(wall, 1e-9),
            "appended": len(appended), "append_failures": append_fail, "append_ms": append_ms,
            "calls_all": state["done"],
            "client_cpu": (time.process_time() - cpu0) / (time.perf_counter() - t_begin)}


def _run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def run_cell(server: Server, bodies, route, conc, args, bank_ids, tag, per_call: int = 1) -> dict:
    cpu0, (b0, a0), th0 = server.cpu_seconds(), server.busy_seconds(), server.thread_cpu()
    t0 = time.perf_counter()
    r = _run(_load(server.url, bodies, route, conc, args.duration, args.max_requests, args.warmup,
                          args.append_every, bank_ids, tag))
    wall_all = time.perf_counter() - t0
    cpu1, (b1, a1), th1 = server.cpu_seconds(), server.busy_seconds(), server.thread_cpu()
    results = [x for a in r["answers"] for x in (a["results"] if "results" in a else [a])]
    bs = np.array([x["timings"]["batch_size"] for x in results], dtype=np.float64)
    tm = lambda k: np.array([x["timings"][k] for x in results], dtype=np.float64)  # noqa: E731
    lat_ms = np.array(r["lat"]) * 1e3
    n_q = len(results)
    out = {
        "server": server.name, "max_batch": server.max_batch, "max_wait_ms": server.max_wait_ms, "conc": conc,
        "route": route, "queries_per_call": per_call, "calls": len(r["lat"]), "queries": n_q,
        "throughput_qps": n_q / r["wall"], "p50_ms": pct(lat_ms, 50), "p95_ms": pct(lat_ms, 95),
        "p99_ms": pct(lat_ms, 99), "failed": len(r["failures"]), "failures_sample": r["failures"][:3],
        "mean_batch": float(len(bs) / np.sum(1.0 / bs)) if len(bs) else float("nan"),
        "appended": r["appended"], "append_failures": len(r["append_failures"]),
        "append_ms": r["append_ms"],
        # the server process over the whole cell (warm-up included)
        "worker_busy": (b1 - b0) / wall_all, "assembly_busy": (a1 - a0) / wall_all,
        "server_cpu_cores": (cpu1 - cpu0) / wall_all,
        "client_cpu_cores": r["client_cpu"],
    }
    if per_call == 1 and len(lat_ms) == n_q and n_q:  # where the slowest 1% spent their time (server side)
        slow = np.flatnonzero(lat_ms >= out["p99_ms"])
        out["tail_split_ms"] = {"latency": float(np.median(lat_ms[slow]))} | {
            k: float(np.median(tm(k)[slow])) for k in ("queue_ms", "encode_ms", "select_ms", "total_ms")}
    n_all = max(1, r["calls_all"] * per_call)  # queries answered over the whole cell, warm-up included
    out["server_cpu_ms_per_query"] = {k: (th1[k] - th0[k]) * 1e3 / n_all for k in th0}
    if n_q:
        per = lambda k: float(np.mean(tm(k) / bs))  # noqa: E731 - a batch's time shared by its queries
        out["per_query_ms"] = {"encode": per("encode_ms"), "select": per("select_ms"),
                               "assemble": float(np.mean(tm("assemble_ms")))}
        out["latency_split_ms"] = {  # medians over requests (per call for batch calls)
            "queue": float(np.median(tm("queue_ms"))), "encode_batch": float(np.median(tm("encode_ms"))),
            "select_batch": float(np.median(tm("select_ms"))), "assemble_own": float(np.median(tm("assemble_ms"))),
            "server_total": float(np.median(tm("total_ms"))),
            "http_and_client": float(np.median(lat_ms)) - float(np.median(tm("total_ms")))}
    return out


# ----------------------------------------------------------------------------------------------
# in-process reference
# ----------------------------------------------------------------------------------------------
class InProcess:
    def __init__(self, banks, items, threads: int, encode_chunk: int):
        import torch

        from trawmem_gpu.encode import get_encoder
        from trawmem_gpu.select.engine import SelectionEngine

        torch.set_num_threads(threads)
        self.enc = get_encoder("minilm", cache=False)
        self.eng = SelectionEngine(banks, threads=threads)
        self.items = items
        self.encode_chunk = encode_chunk
        self.pos = 0
        self.rate(4, 0.5)  # warm-up (numba, encoder)

    def rate(self, batch: int, seconds: float) -> float:
        """Queries/s of encode + select in batches of ``batch`` for about ``seconds``."""
        batch = max(1, int(round(batch)))
        n, t0 = 0, time.perf_counter()
        while True:
            chunk = [self.items[(self.pos + i) % len(self.items)] for i in range(batch)]
            self.pos += batch
            ids, qs = [b for b, _ in chunk], [q for _, q in chunk]
            Z = self.enc.encode(qs, is_query=True, batch_size=self.encode_chunk)
            self.eng.select_units(ids, qs, Z)
            n += batch
            dt = time.perf_counter() - t0
            if dt >= seconds:
                return n / dt


def encoder_chunks(enc, questions: list[str], rounds: int = 3, n: int = 128) -> dict:
    """CPU ms per question of the query encoder, one question at a time and in length-sorted
    chunks of 8-64 (``--encode-chunk``), interleaved over rounds; medians."""
    out: dict = {}
    for _ in range(rounds):
        for chunk in (1, 8, 16, 32, 64):
            qs = questions[:n // 8] if chunk == 1 else questions[:n]
            c0 = time.process_time()
            if chunk == 1:
                for q in qs:
                    enc.encode([q], is_query=True)
            else:
                for s in range(0, len(qs), 64):
                    enc.encode(qs[s:s + 64], is_query=True, batch_size=chunk)
            out.setdefault(chunk, []).append((time.process_time() - c0) / len(qs) * 1e3)
    return {c: float(np.median(v)) for c, v in out.items()}


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def median_cells(cells: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["server"], c["conc"], c["route"], c["queries_per_call"], c.get("vectors", False)),
                          []).append(c)
    out = []
    for key, cs in groups.items():
        m = dict(cs[0])
        for k in ("throughput_qps", "p50_ms", "p95_ms", "p99_ms", "mean_batch", "worker_busy", "server_cpu_cores",
                  "inproc_qps", "served_over_inproc"):
            vals = [c[k] for c in cs if c.get(k) is not None and not np.isnan(c[k])]
            m[k] = float(np.median(vals)) if vals else None
        m["failed"] = sum(c["failed"] for c in cs)
        m["rounds"] = len(cs)
        m["served_over_inproc_rounds"] = [c.get("served_over_inproc") for c in cs]
        out.append(m)
    return out


def table(rows: list[dict]) -> str:
    head = ("| server | clients | queries/s | p50 ms | p95 ms | p99 ms | p99/p50 | mean batch | in-process q/s "
            "(same batch) | served / in-process | worker busy | failed |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['server']} | {r['conc']} | {r['throughput_qps']:.1f} | {r['p50_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {r['p99_ms'] / r['p50_ms']:.2f} | "
                     f"{r['mean_batch']:.1f} | {(r.get('inproc_qps') or float('nan')):.1f} | "
                     f"{(r.get('served_over_inproc') or float('nan')):.2f} | {r['worker_busy']:.2f} | {r['failed']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["server"] for r in rows):
        rs = sorted((r for r in rows if r["server"] == name), key=lambda r: r["conc"])
        x = [r["throughput_qps"] for r in rs]
        for a, k in zip(ax, ("p50_ms", "p99_ms")):
            a.plot(x, [r[k] for r in rs], marker="o", label=name)
            for r in rs:
                a.annotate(str(r["conc"]), (r["throughput_qps"], r[k]), fontsize=7, textcoords="offset points",
                           xytext=(3, 3))
    for a, k in zip(ax, ("p50", "p99")):
        a.set_xlabel("throughput (queries/s)")
        a.set_ylabel(f"{k} latency (ms)")
        a.set_yscale("log")
        a.grid(alpha=0.3)
        a.set_title(f"{k} latency vs throughput (labels: concurrent clients)")
    ax[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo-layout dev file, or 'sample'")
    p.add_argument("--waits", default="0,5,20", help="--max-wait-ms settings of the batching servers")
    p.add_argument("--ref-wait", type=float, default=5.0,
                   help="the batching server the targets are read from (the server's default --max-wait-ms)")
    p.add_argument("--conc", default="1,8,64,256", help="concurrent clients per cell")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-requests", type=int, default=100_000, help="bound on measured requests per cell")
    p.add_argument("--append-every", type=float, default=1.0, help="seconds between appends (0: none)")
    p.add_argument("--inproc-seconds", type=float, default=3.0, help="in-process seconds per cell (half before it)")
    p.add_argument("--threads", type=int, default=1, help="torch / engine threads, server and in-process alike")
    p.add_argument("--switch-interval-ms", type=float, default=0.5, help="the servers' GIL switch interval")
    p.add_argument("--encode-chunk", type=int, default=16, help="questions per encoder pass, server and in-process")
    p.add_argument("--where-conc", type=int, default=64)
    p.add_argument("--batch-call", type=int, default=16, help="requests per /v1/select/batch call")
    p.add_argument("--encoder-runtime", default="torch", choices=("torch", "onnx"),
                   help="TRAWMEM_ENCODER_RUNTIME of the servers and the in-process reference")
    p.add_argument("--baseline-src", default=None,
                   help="a source tree of an earlier version (e.g. `git archive COMMIT | tar -x -C DIR`): its "
                        "server, configured as the reference one, runs the client-vector cells too, alternating "
                        "with it in every round (before / after in one run)")
    p.add_argument("--skip-text", action="store_true", help="only the client-vector cells (no text questions)")
    p.add_argument("--http-workers", default="1",
                   help="comma list: a reference-configured server with each --http-workers N (front processes) "
                        "also runs the client-vector cells, alternating with the others ('' for none)")
    p.add_argument("--quick", action="store_true", help="1 round, 3 s cells, waits 0,5, clients 1,8,64")
    p.add_argument("--out-dir", default=str(HERE / "results"))
    p.add_argument("--name", default="serve", help="result files: NAME.json and NAME.png in --out-dir")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.duration, a.waits, a.conc, a.inproc_seconds = 1, 3.0, "0,5", "1,8,64", 1.0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["TRAWMEM_ENCODER_RUNTIME"] = a.encoder_runtime  # the in-process reference's encoder too
    random.seed(0)
    waits = [float(w) for w in a.waits.split(",")]
    concs = [int(c) for c in a.conc.split(",")]

    src, banks, items = load_data(a.data)
    bank_ids = sorted({b for b, _ in items})
    print(f"data: {len(banks)} banks, {sum(b.n_units for b in banks)} units, {len(items)} questions; "
          f"threads {a.threads}", flush=True)
    inproc = InProcess(banks, items, a.threads, a.encode_chunk)
    Z = inproc.enc.encode([q for _, q in items], is_query=True)
    chunks = encoder_chunks(inproc.enc, [q for _, q in items])
    print("encoder CPU ms per question by chunk size: " + ", ".join(f"{c}: {v:.2f}" for c, v in chunks.items()),
          flush=True)
    text_bodies = [json.dumps({"bank_id": b, "question": q}).encode() for b, q in items]
    vec_bodies = [json.dumps({"bank_id": b, "question": q, "question_vector": [round(float(x), 6) for x in z]}).encode()
                  for (b, q), z in zip(items, Z)]
    batch_bodies = [b"{\"requests\": [" + b", ".join(vec_bodies[(i + j) % len(vec_bodies)] for j in range(a.batch_call))
                    + b"]}" for i in range(0, len(vec_bodies), a.batch_call)]

    work = Path(tempfile.mkdtemp(prefix="trawmem-bench-serve-"))
    servers = [Server(f"batch{a.max_batch}-wait{w:g}ms", src, work, a, a.max_batch, w) for w in waits]
    # batch-size-1 serving sits next to the reference server, so their cells of a round are adjacent
    servers.insert(next((i + 1 for i, w in enumerate(waits) if w == a.ref_wait), len(servers)),
                   Server("batch1", src, work, a, 1, 0.0))
    base = None
    if a.baseline_src:
        base = Server(f"baseline-wait{a.ref_wait:g}ms", src, work, a, a.max_batch, a.ref_wait,
                      root=Path(a.baseline_src).resolve())
        servers.append(base)
    fronts = [Server(f"fronts{n}-wait{a.ref_wait:g}ms", src, work, a, a.max_batch, a.ref_wait, http_workers=n)
              for n in (int(x) for x in a.http_workers.split(",") if x.strip())]
    servers += fronts
    stored0 = {s.name: sum(b.n_units for b in banks) for s in servers}
    cells, where = [], []
    try:
        for s in servers:
            s.wait_ready()
        print(f"{len(servers)} servers ready", flush=True)
        prev_batch: dict = {}
        text_servers = [s for s in servers if s is not base and s not in fronts]
        for rnd in range(0 if a.skip_text else a.rounds):
            order = [(s, c) for c in concs
                     for s in (text_servers if (rnd + concs.index(c)) % 2 == 0 else text_servers[::-1])]
            for s, c in order:
                # in-process at this cell's batch size right before (the previous round's batch size,
                # else the concurrency bound) and right after the cell; their mean pairs with the cell
                guess = prev_batch.get((s.name, c), min(c, s.max_batch))
                before = inproc.rate(guess, a.inproc_seconds / 2)
                cell = run_cell(s, text_bodies, "/v1/select", c, a, bank_ids, f"{s.name}-{c}-{rnd}")
                cell["round"] = rnd
                after = inproc.rate(cell["mean_batch"], a.inproc_seconds / 2)
                cell["inproc_qps"] = after if round(guess) != round(cell["mean_batch"]) else (before + after) / 2
                cell["served_over_inproc"] = cell["throughput_qps"] / cell["inproc_qps"]
                prev_batch[(s.name, c)] = cell["mean_batch"]
                cells.append(cell)
                print(f"round {rnd} {s.name:>18} x{c:<4} {cell['throughput_qps']:7.1f} q/s  p50 {cell['p50_ms']:7.1f}"
                      f"  p99 {cell['p99_ms']:7.1f} ms  batch {cell['mean_batch']:5.1f}  in-process "
                      f"{cell['inproc_qps']:7.1f} q/s ({cell['served_over_inproc']:.2f})  busy "
                      f"{cell['worker_busy']:.2f}  failed {cell['failed']}", flush=True)
        # where the time goes: client-supplied vectors on the reference batching server
        bs = next((s for s in servers if s.max_wait_ms == a.ref_wait and s.max_batch > 1), servers[0])
        b1 = next(s for s in servers if s.name == "batch1")
        for rnd in range(a.rounds):
            for route, bodies, per in (("/v1/select", vec_bodies, 1), ("/v1/select/batch", batch_bodies, a.batch_call)):
                conc = a.where_conc if per == 1 else max(1, a.where_conc // per)
                pair = ([bs] if base is None else [bs, base]) + fronts
                if per == 1:  # batch-size-1 serving of the same vectors, next to the reference server
                    pair.append(b1)
                pair = pair if rnd % 2 == 0 else pair[::-1]
                for srv in pair:
                    cell = run_cell(srv, bodies, route, conc, a, bank_ids, f"vec-{srv.name}-{route[-5:]}-{rnd}", per)
                    cell["vectors"], cell["round"] = True, rnd
                    where.append(cell)
                    print(f"vectors {srv.name:>18} {route:>16} x{conc:<4} ({per}/call) {cell['throughput_qps']:7.1f} "
                          f"q/s  p50 {cell['p50_ms']:7.1f} ms  batch {cell['mean_batch']:5.1f}  busy "
                          f"{cell['worker_busy']:.2f}  cpu {cell['server_cpu_cores']:.2f}  per query "
                          f"{cell.get('server_cpu_ms_per_query')}  split {cell.get('latency_split_ms')}", flush=True)
        # turns appended vs stored
        import httpx

        appended = {s.name: 0 for s in servers}
        for c in cells + where:
            appended[c["server"]] += c["appended"]
        api_stored = {s.name: sum(b["n_units"] for b in httpx.get(s.url + "/v1/banks", timeout=30).json()["banks"])
                      - stored0[s.name] for s in servers}
    finally:
        for s in servers:
            s.stop()
    from trawmem_gpu.store import Collection

    disk_stored = {s.name: sum(Collection(s.coll).load(b).n_units for b in Collection(s.coll).bank_ids)
                   - stored0[s.name] for s in servers}
    shutil.rmtree(work, ignore_errors=True)

    rows = median_cells(cells)
    wrows = median_cells(where)
    ref = bs.name
    dyn = {r["conc"]: r for r in rows if r["server"] == ref}
    failed = sum(c["failed"] for c in cells + where) + sum(c["append_failures"] for c in cells + where)
    # dynamic batching over batch-size-1 serving: the two cells of one round ran back to back
    by = {(c["server"], c["conc"], c["round"]): c["throughput_qps"] for c in cells}
    speedup = {c: [by[(ref, c, r)] / by[("batch1", c, r)] for r in range(a.rounds)
                   if (ref, c, r) in by and ("batch1", c, r) in by] for c in concs}
    # client-supplied vectors: this version over the baseline tree's, per round (cells back to back)
    vby = {(c["server"], c["route"], c["round"]): c["throughput_qps"] for c in where}
    after_over_before = {} if base is None else {
        route: [vby[(ref, route, r)] / vby[(base.name, route, r)] for r in range(a.rounds)]
        for route in ("/v1/select", "/v1/select/batch")}
    vspeed = [vby[(ref, "/v1/select", r)] / vby[("batch1", "/v1/select", r)] for r in range(a.rounds)
              if (ref, "/v1/select", r) in vby and ("batch1", "/v1/select", r) in vby]
    fronts_ratio = {f.name: {route: [vby[(f.name, route, r)] / vby[(ref, route, r)] for r in range(a.rounds)
                                     if (f.name, route, r) in vby and (ref, route, r) in vby]
                             for route in ("/v1/select", "/v1/select/batch")} for f in fronts}
    fronts_b1 = {f.name: [vby[(f.name, "/v1/select", r)] / vby[("batch1", "/v1/select", r)] for r in range(a.rounds)
                          if (f.name, "/v1/select", r) in vby and ("batch1", "/v1/select", r) in vby] for f in fronts}
    targets = {
        "reference_server": ref,
        "vectors_fronts_over_reference": {f: {k: float(np.median(v)) for k, v in d.items() if v}
                                          for f, d in fronts_ratio.items()},
        "vectors_fronts_over_reference_rounds": fronts_ratio,
        "vectors_fronts_over_batch1": {f: float(np.median(v)) for f, v in fronts_b1.items() if v},
        "vectors_fronts_over_batch1_rounds": fronts_b1,
        "vectors_dynamic_over_batch1": float(np.median(vspeed)) if vspeed else None,
        "vectors_dynamic_over_batch1_rounds": vspeed,
        "vectors_after_over_before": {k: float(np.median(v)) for k, v in after_over_before.items()},
        "vectors_after_over_before_rounds": after_over_before,
        "served_over_inproc_at_64": dyn.get(64, {}).get("served_over_inproc"),
        "served_over_inproc_at_64_rounds": dyn.get(64, {}).get("served_over_inproc_rounds"),
        "dynamic_over_batch1": {c: float(np.median(v)) for c, v in speedup.items() if v},
        "dynamic_over_batch1_rounds": speedup,
        "worst_p99_over_p50": max((r["p99_ms"] / r["p50_ms"] for r in rows), default=None),
        "failed": failed,
        "turns_appended": appended, "turns_stored_api": api_stored, "turns_stored_disk": disk_stored,
        "turns_match": appended == api_stored == disk_stored,
    }
    print("\n" + table(rows))
    print("\nclient-supplied vectors (where the time goes):")
    for r in wrows:
        print(f"  {r['server']} {r['route']} ({r['queries_per_call']}/call, {r['conc']} clients): "
              f"{r['throughput_qps']:.0f} q/s, "
              f"worker busy {r['worker_busy']:.2f}, server CPU {r['server_cpu_cores']:.2f} cores, per query "
              f"{r.get('per_query_ms')}, latency split {r.get('latency_split_ms')}")
    print("\ntargets:", json.dumps(targets, indent=1))
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
           "args": vars(a), "n_banks": len(banks), "n_units": int(sum(b.n_units for b in banks)),
           "n_questions": len(items), "encoder_cpu_ms_per_question_by_chunk": chunks, "cells": cells,
           "where": where, "table": rows, "where_table": wrows,
           "targets": targets}
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=1, default=float))
    plot(rows, out / f"{a.name}.png")
    print(f"-> {out / (a.name + '.json')}, {out / (a.name + '.png')}")
    return 0 if failed == 0 and targets["turns_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
