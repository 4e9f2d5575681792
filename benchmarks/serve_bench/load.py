"""The load generator: keep-alive connections, closed-loop clients with an appender, and one
measured cell (client latencies beside the server's own timings and CPU)."""
from __future__ import annotations

import asyncio
import json
import random
import time

import numpy as np
from ..harness import pct

from .servers import Server


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
