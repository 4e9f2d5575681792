"""The adversarial load of ``bench_serve.py --hostile``: a victim tenant beside a hostile one.

The victim sends single ``/v1/select`` requests (text questions) at a steady rate (open loop:
each request leaves on schedule whether or not the previous one was answered), first alone
(``unloaded``), then while the hostile tenant runs every attack of issue 23 at once
(``loaded``), on the same server in one run:

* **oversized fields**: a 3.5 MB ``date``, a 1 MB question, a 9,000-number vector, a 300-character
  bank id, a 5,000-request batch body, a body over the size cap (each expects 413 or 422);
* **a 64-distinct-parameter batch**: one ``/v1/select/batch`` of 64 requests, every (budget, hops)
  pair different (expects 200: one engine call, no engine builds);
* **a large append**: ``append_turns`` turns in one request to the hostile tenant's bank (expects
  200; its duration gives the append rate the server sustains under load);
* **a 4 MB filter**: ``/v1/select`` with ``where`` ``{"and": [{}, {}, ...]}`` of ``where_bytes``
  (under the 4 MiB body cap), sent ``oversized_rounds`` times (expects 422: the filter's bounds;
  its parse must not hold up other tenants' requests);
* **256-query batches**: ``big_batches`` clients sending 256-request batches back to back
  (each answered 200, or 429 once the tenant's queue share is used up);
* **slow connections**: ``slow`` connections trickling one header byte a second, and ``idle``
  connections that send nothing; each reconnects when the server closes it (the server should
  close them at its header timeout, with 408).

A third phase measures the victim while only a large append (``big_append_turns``, 1,000 in the
full form) runs on the hostile tenant's bank: the append rate the server sustains beside
queries, and what the append costs them.

The victim's load generator runs in a process of its own (:class:`VictimProcess`): in the
attacker's event loop, the attack's client work (building 256-query bodies, reading their
answers, reconnecting 500 slow connections) delayed the victim's sends and receives and was
measured as server latency.

Errors of the victim are any answer but 200 (or no answer within 60 s). The parts are plain
coroutines over a URL and two API keys, so the CI test (tests/serve/test_serve_hostile.py) runs the
same code in a short form against an in-process server.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

import numpy as np

from .load import Conn


@dataclass
class Spec:
    """Sizes of one hostile run (the defaults are the full form of issue 23)."""

    victim_rate_hz: float = 8.0
    phase_s: float = 20.0
    """Seconds the victim is measured in each phase (unloaded, then loaded)."""
    settle_s: float = 2.0
    """Seconds the attacks run before the loaded phase is measured."""
    append_turns: int = 300
    big_batches: int = 2
    """Concurrent clients sending 256-query batches."""
    batch_size: int = 256
    slow: int = 300
    idle: int = 200
    oversized_date_bytes: int = 3_500_000
    big_append_turns: int = 1000
    """Turns of the append-only phase (0: no such phase)."""
    oversized_rounds: int = 3
    """Times the list of oversized requests is sent."""
    over_cap_bytes: int = 5 << 20
    """Size of the body sent over the size cap (the server's default cap is 4 MiB)."""
    where_bytes: int = 4_000_000
    """Size of the ``where`` of the big-filter attack (0: none)."""


def _head(path: str, port: int, key: str, n: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {n}\r\n\r\n").encode()


RETRIES = {"stale_keepalive": 0}
"""Requests resent once because the server had closed their idle keep-alive connection (its
keep-alive bound) just before they were written; an HTTP client does the same."""


async def _post(conn: Conn, path: str, port: int, key: str, body: bytes, timeout: float = 60.0) -> tuple[int, bytes]:
    head = _head(path, port, key, len(body))
    for attempt in (0, 1):
        reused = conn.w is not None
        try:
            return await asyncio.wait_for(conn.request(head, body), timeout)
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as e:
            await conn.close()
            if reused and attempt == 0 and not isinstance(e, asyncio.TimeoutError):
                RETRIES["stale_keepalive"] += 1
                continue
            return -1, type(e).__name__.encode()
        except asyncio.TimeoutError as e:
            await conn.close()
            return -1, type(e).__name__.encode()
    return -1, b"unreachable"


def _merge(parts: list[dict]) -> dict:
    """One summary of consecutive victim windows (their raw latencies kept in each)."""
    return _summary([x for p in parts for x in p["lat_ms"]], [x for p in parts for x in p["statuses"]])


def _summary(lat_ms: list[float], statuses: list[int]) -> dict:
    lat = np.asarray(lat_ms, dtype=np.float64)
    bad = [s for s in statuses if s != 200]
    return {"n": len(statuses), "errors": len(bad), "error_statuses": sorted(set(bad)),
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
            "max_ms": float(lat.max()) if len(lat) else None, "lat_ms": [round(x, 2) for x in lat_ms],
            "statuses": statuses}


async def victim(port: int, key: str, bodies: list[bytes], rate_hz: float, duration_s: float) -> dict:
    """Single selects at ``rate_hz`` for ``duration_s`` (open loop, a few keep-alive connections)."""
    pool = [Conn("127.0.0.1", port) for _ in range(8)]
    free = list(pool)
    lat, statuses = [], []

    async def one(i: int):
        conn = free.pop() if free else Conn("127.0.0.1", port)
        t0 = time.perf_counter()
        status, _ = await _post(conn, "/v1/select", port, key, bodies[i % len(bodies)])
        lat.append((time.perf_counter() - t0) * 1e3)
        statuses.append(status)
        free.append(conn)

    tasks, t_start, i = [], time.perf_counter(), 0
    while True:
        due = t_start + i / rate_hz
        if due - t_start >= duration_s:
            break
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
    await asyncio.gather(*tasks)
    for c in free:
        await c.close()
    return _summary(lat, statuses)


def oversized_bodies(bank: str, spec: Spec) -> list[tuple[str, str, bytes]]:
    """(name, path, body) of each oversized request."""
    q = {"bank_id": bank, "question": "What did they talk about?"}
    return [
        ("date_3.5MB", "/v1/select", json.dumps({**q, "date": "7" * spec.oversized_date_bytes}).encode()),
        ("question_1MB", "/v1/select", json.dumps({**q, "question": "why " * 250_000}).encode()),
        ("vector_9000", "/v1/select", json.dumps({**q, "question_vector": [0.1] * 9000}).encode()),
        ("bank_id_300", "/v1/select", json.dumps({**q, "bank_id": "b" * 300}).encode()),
        ("batch_5000", "/v1/select/batch", json.dumps({"requests": [q] * 5000}).encode()),
        ("body_over_cap", "/v1/select", json.dumps({**q, "question": "x" * spec.over_cap_bytes}).encode()),
    ]


def where_body(bank: str, nbytes: int) -> bytes:
    """A ``/v1/select`` body whose ``where`` is ``{"and": [{}, {}, ...]}`` of about ``nbytes``."""
    n = max(1, (nbytes - 10) // 3)
    return (json.dumps({"bank_id": bank, "question": "What did they talk about?"})[:-1]
            + ', "where": {"and": [' + ",".join(["{}"] * n) + "]}}").encode()


def param_batch(bank: str) -> bytes:
    """64 requests, every (budget, hops) pair distinct."""
    reqs = [{"bank_id": bank, "question": f"What happened on day {b}?", "budget": b, "hops": h}
            for b in range(1, 17) for h in range(4)]
    return json.dumps({"requests": reqs}).encode()


def append_body(n: int, tag: str, day: int = 1) -> bytes:
    """``n`` turns a minute apart from 10:00 on 2031-03-``day`` (in time order: the server refuses a
    turn dated before the one it follows)."""
    t0 = datetime(2031, 3, day, 10, 0)
    turns = [{"turn_id": f"{tag}-{i}", "speaker": "Mallory" if i % 2 else "Trent",
              "text": f"Note {i}: the quarterly plan for the garden project moves to week {i % 52}.",
              "timestamp": (t0 + timedelta(minutes=i)).isoformat()} for i in range(n)]
    return json.dumps({"turns": turns}).encode()


async def _slow_conn(port: int, stop: asyncio.Event, idle: bool, out: dict) -> None:
    """One slow-header (or idle) connection, reopened each time the server closes it."""
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            out["connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        out["opened"] += 1
        head = b"POST /v1/select HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
        i = 0
        try:
            while not stop.is_set():
                if not idle and i < len(head):
                    w.write(head[i:i + 1])
                    i += 1
                try:
                    data = await asyncio.wait_for(r.read(4096), 1.0)
                except asyncio.TimeoutError:
                    continue
                if data.startswith(b"HTTP/1.1 408"):
                    out["got_408"] += 1
                out["closed_by_server"] += 1  # an answer or EOF: the server is done with it
                break
        except (ConnectionError, OSError):
            out["closed_by_server"] += 1
        finally:
            w.close()


async def hostile(port: int, key: str, bank: str, spec: Spec, stop: asyncio.Event, tag: str) -> dict:
    """Every attack at once until ``stop`` is set (the append runs to its end)."""
    res = {"oversized": {}, "big_where": [], "param_batch": None, "append": None, "big_batches": {}, "slow": None,
           "idle": None}

    async def oversized():
        conn = Conn("127.0.0.1", port)
        for _ in range(spec.oversized_rounds):
            for name, path, body in oversized_bodies(bank, spec):
                if stop.is_set():
                    return
                status, _ = await _post(conn, path, port, key, body)
                res["oversized"].setdefault(name, []).append(status)
                if status == 413:
                    await conn.close()  # the server does not read a refused body: a fresh connection
            await asyncio.sleep(0.2)
        await conn.close()

    async def big_where():
        if not spec.where_bytes:
            return
        conn, body = Conn("127.0.0.1", port), where_body(bank, spec.where_bytes)
        for _ in range(spec.oversized_rounds):
            if stop.is_set():
                break
            t0 = time.perf_counter()
            status, _ = await _post(conn, "/v1/select", port, key, body, timeout=300)
            res["big_where"].append({"status": status, "seconds": round(time.perf_counter() - t0, 3)})
            await asyncio.sleep(0.5)
        await conn.close()

    async def params():
        conn = Conn("127.0.0.1", port)
        t0 = time.perf_counter()
        status, _ = await _post(conn, "/v1/select/batch", port, key, param_batch(bank))
        res["param_batch"] = {"status": status, "seconds": time.perf_counter() - t0}
        await conn.close()

    async def append():
        res["append"] = await _append(port, key, bank, spec.append_turns, tag)

    big = json.dumps({"requests": [{"bank_id": bank, "question": f"What was said about topic {i}?"}
                                   for i in range(spec.batch_size)]}).encode()

    async def batches(j: int):
        conn = Conn("127.0.0.1", port)
        counts = res["big_batches"]
        while not stop.is_set():
            status, _ = await _post(conn, "/v1/select/batch", port, key, big)
            counts[str(status)] = counts.get(str(status), 0) + 1
            if status == 429:
                await asyncio.sleep(0.5)
        await conn.close()

    slow_out = dict.fromkeys(("opened", "closed_by_server", "got_408", "connect_failed"), 0)
    idle_out = dict(slow_out)
    res["slow"], res["idle"] = slow_out, idle_out
    conns = [asyncio.ensure_future(_slow_conn(port, stop, False, slow_out)) for _ in range(spec.slow)]
    conns += [asyncio.ensure_future(_slow_conn(port, stop, True, idle_out)) for _ in range(spec.idle)]
    loops = [asyncio.ensure_future(f)
             for f in (oversized(), big_where(), params(), *(batches(j) for j in range(spec.big_batches)))]
    app = asyncio.ensure_future(append())
    await stop.wait()
    await asyncio.gather(*loops, *conns)
    await app
    return res


def _victim_sync(port: int, key: str, bodies: list[bytes], rate_hz: float, duration_s: float) -> dict:
    return {**asyncio.run(victim(port, key, bodies, rate_hz, duration_s)), "pid": os.getpid()}


def loadavg() -> list[float] | None:
    """The host's 1/5/15-minute load averages (None where ``os.getloadavg`` is missing)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover - not Unix
        return None


class VictimProcess:
    """The victim's load generator in a process of its own (spawned, so nothing of the parent's
    event loop or threads comes along): ``await vp.run(...)`` measures one window, as
    :func:`victim` does, without sharing a CPU thread or event loop with the attacker."""

    def __init__(self):
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    async def run(self, port: int, key: str, bodies: list[bytes], rate_hz: float, duration_s: float) -> dict:
        return await asyncio.get_running_loop().run_in_executor(self.pool, _victim_sync, port, key, bodies,
                                                                rate_hz, duration_s)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


async def _append(port: int, key: str, bank: str, n: int, tag: str, day: int = 1) -> dict:
    conn = Conn("127.0.0.1", port)
    t0 = time.perf_counter()
    status, body = await _post(conn, f"/v1/banks/{bank}/turns", port, key, append_body(n, tag, day), timeout=600)
    dt = time.perf_counter() - t0
    await conn.close()
    return {"status": status, "turns": n, "seconds": dt, "turns_per_s": n / dt,
            "appended": json.loads(body).get("appended") if status == 200 else None}


async def append_phase(port: int, victim_key: str, victim_bodies: list[bytes], hostile_key: str, bank: str,
                       spec: Spec, tag: str, vp: VictimProcess) -> dict:
    """The victim while one large append runs (the victim is measured until the append is done)."""
    app = asyncio.ensure_future(_append(port, hostile_key, bank, spec.big_append_turns, f"{tag}-big", day=2))
    lat_parts = []
    while not app.done():
        lat_parts.append(await vp.run(port, victim_key, victim_bodies, spec.victim_rate_hz,
                                      min(spec.phase_s, 5.0)))
    return {"append": await app, "victim_windows": lat_parts}


async def run_phases(port: int, victim_key: str, victim_bodies: list[bytes], hostile_key: str, hostile_bank: str,
                     spec: Spec, tag: str = "h") -> dict:
    """The victim alone, then the victim beside the hostile tenant (same server, one run); the
    victim measured from its own process (:class:`VictimProcess`), the host's load averages
    recorded at the start and the end."""
    RETRIES["stale_keepalive"] = 0
    load_start = loadavg()
    vp = VictimProcess()
    try:
        unloaded = await vp.run(port, victim_key, victim_bodies, spec.victim_rate_hz, spec.phase_s)
        stop = asyncio.Event()
        h = asyncio.ensure_future(hostile(port, hostile_key, hostile_bank, spec, stop, tag))
        await asyncio.sleep(spec.settle_s)
        loaded = await vp.run(port, victim_key, victim_bodies, spec.victim_rate_hz, spec.phase_s)
        stop.set()
        attacks = await h
        big = None
        if spec.big_append_turns:
            big = await append_phase(port, victim_key, victim_bodies, hostile_key, hostile_bank, spec, tag, vp)
            big["victim"] = _merge(big.pop("victim_windows"))
    finally:
        vp.close()
    return {"spec": asdict(spec), "loadavg_start": load_start, "loadavg_end": loadavg(), "unloaded": unloaded, "loaded": loaded, "hostile": attacks, "append_phase": big,
            "client_stale_keepalive_retries": RETRIES["stale_keepalive"],
            "p99_loaded_over_unloaded": (loaded["p99_ms"] / unloaded["p99_ms"]
                                         if loaded["p99_ms"] and unloaded["p99_ms"] else None)}


def hostile_got_4xx(res: dict) -> bool:
    """Every oversized request was refused with 413 or 422."""
    return all(s in (413, 422) for v in res["hostile"]["oversized"].values() for s in v) and bool(
        res["hostile"]["oversized"])


def keys_doc(victim_hash: str, hostile_hash: str, victim_banks: list[str], hostile_banks: list[str]) -> dict:
    return {"keys": [{"sha256": victim_hash, "tenant": "victim", "banks": victim_banks, "access": "read-only"},
                     {"sha256": hostile_hash, "tenant": "hostile", "banks": hostile_banks, "access": "read-write"}]}
