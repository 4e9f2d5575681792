"""``trawmem serve --http-workers N``: HTTP in front processes, one engine process (serve/remote.py).

The real command in a subprocess on a free port, driven by a real HTTP client: the same API,
keys and statuses as one process, appends read back through any front, metrics summed over
the fronts, errors carried across the socket as the same classes, and a clean shutdown.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, build_sample_collection, serve_command  # noqa: E402


class http:  # noqa: N801 - httpx's one-shot functions (a new connection per request), with a longer timeout
    """Every one-shot request of this file: a first append builds a bank, which on a loaded machine
    can take longer than httpx's 5 s default (a bound on a hang, not a timing assertion)."""

    @staticmethod
    def post(*a, **k):
        return httpx.post(*a, **{"timeout": 120, **k})

    @staticmethod
    def get(*a, **k):
        return httpx.get(*a, **{"timeout": 120, **k})

    @staticmethod
    def delete(*a, **k):
        return httpx.delete(*a, **{"timeout": 120, **k})


KEYS = {"rw": "key-fronts-rw-0123456789", "ro": "key-fronts-ro-0123456789"}


def _keys_file(path: Path) -> str:
    def h(k):
        return hashlib.sha256(k.encode()).hexdigest()

    path.write_text(json.dumps({"keys": [
        {"sha256": h(KEYS["rw"]), "tenant": "acme", "banks": [SAMPLE_BANK, "acme-*"], "access": "read-write"},
        {"sha256": h(KEYS["ro"]), "tenant": "reader", "banks": [SAMPLE_BANK], "access": "read-only"},
    ]}))
    return str(path)


@pytest.fixture(scope="module")
def fronts(tmp_path_factory):
    """(url, process) of `trawmem serve --http-workers 2` over a copy of the sample collection."""
    tmp = tmp_path_factory.mktemp("fronts")
    coll = build_sample_collection(tmp / "coll")
    proc, url, lines = serve_command(coll, "--http-workers", "2", "--keys", _keys_file(tmp / "keys.json"),
                                     "--max-wait-ms", "2",
                                     "--tenant-max-appends", "8")  # 8 appends of one key at once, below
    proc.lines = lines
    yield url, proc, coll
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _auth(k):
    return {"Authorization": f"Bearer {KEYS[k]}"}


def _turn(tid, text="We adopted a puppy called Biscuit today.", ts="2024-06-01T10:00:00"):
    return {"turn_id": tid, "speaker": "Ana", "text": text, "timestamp": ts}


def test_same_api_and_statuses_as_one_process(fronts):
    url, _, _ = fronts
    q = {"bank_id": SAMPLE_BANK, "question": "Where does Clara live now?"}
    assert http.post(url + "/v1/select", json=q).status_code == 401
    r = http.post(url + "/v1/select", json=q, headers=_auth("ro"))
    assert r.status_code == 200, r.text
    ws = r.json()
    assert ws["bank_id"] == SAMPLE_BANK and ws["units"] and ws["n_tokens"] > 0 and ws["timings"]["batch_size"] >= 1
    # a foreign bank and a missing one: the same 404
    for bank in ("acme-nothing", "someone-else"):
        r = http.post(url + "/v1/select", json={**q, "bank_id": bank}, headers=_auth("ro"))
        assert r.status_code == 404 and "unknown bank id" in r.json()["detail"]
    # validation runs in the front; bad vectors are 422
    r = http.post(url + "/v1/select", json={**q, "question_vector": [0.5] * 3}, headers=_auth("ro"))
    assert r.status_code == 422 and "question_vector has 3 numbers" in r.json()["detail"]
    # client-supplied vector: the same workspace as the encoder's own vector for that question
    banks = http.get(url + "/v1/banks", headers=_auth("ro")).json()
    assert banks["banks"] == [{"bank_id": SAMPLE_BANK, "n_units": banks["banks"][0]["n_units"],
                               "n_threads": banks["banks"][0]["n_threads"]}]
    from trawmem_gpu.encode import get_encoder

    z = get_encoder("minilm").encode([q["question"]], is_query=True)[0]
    r2 = http.post(url + "/v1/select", json={**q, "question_vector": [float(x) for x in z]}, headers=_auth("ro"))
    assert r2.status_code == 200 and [u["id"] for u in r2.json()["units"]] == [u["id"] for u in ws["units"]]
    # batch route, with the index of a bad request in the message
    r = http.post(url + "/v1/select/batch", json={"requests": [q, {**q, "bank_id": "acme-x"}]}, headers=_auth("rw"))
    assert r.status_code == 404 and r.json()["detail"].startswith("requests[1]")
    r = http.post(url + "/v1/select/batch", json={"requests": [q, q]}, headers=_auth("rw"))
    assert r.status_code == 200 and len(r.json()["results"]) == 2


def test_appends_through_any_front_are_read_back_and_none_is_lost(fronts):
    url, _, coll = fronts
    h = _auth("rw")
    assert http.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("x1")]},
                      headers=_auth("ro")).status_code == 403
    r = http.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("x1")]}, headers=h)
    assert r.status_code == 200, r.text
    r = http.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("x1")]}, headers=h)
    assert r.status_code == 200 and r.json()["already_stored"] == ["x1"] and r.json()["appended"] == 0, r.text
    assert http.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("x1", "Other words.")],
                      "atomic": True}, headers=h).status_code == 409  # DuplicateTurns crossed the socket as itself
    r = http.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("x1", "Other words.")]}, headers=h)
    assert r.status_code == 200 and r.json()["refused"][0]["field"] == "turns[0].turn_id", r.text  # per item

    def append(i):  # each on its own connection: spread over both fronts
        with httpx.Client(timeout=120) as c:
            return c.post(url + f"/v1/banks/acme-{i % 3}/turns",
                          json={"turns": [_turn(f"t{i}", f"Note number {i} about the garden.")]}, headers=h).status_code

    with ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(append, range(24)))
    assert codes == [200] * 24
    counts = {b["bank_id"]: b["n_units"] for b in http.get(url + "/v1/banks", headers=h).json()["banks"]}
    assert [counts[f"acme-{j}"] for j in range(3)] == [8, 8, 8]
    from trawmem_gpu.store import Collection

    assert [Collection(coll).load(f"acme-{j}").n_units for j in range(3)] == [8, 8, 8]
    r = http.post(url + "/v1/select", json={"bank_id": "acme-1", "question": "What about the garden?"}, headers=h)
    assert r.status_code == 200 and r.json()["bank_n_units"] == 8


def test_a_forget_through_one_front_is_seen_by_every_front(fronts):
    url, _, coll = fronts
    h = _auth("rw")
    turns = [_turn("f1", "My locker code is 4417."), _turn("f2", "Lunch was soup.")]
    assert http.post(url + "/v1/banks/acme-fg/turns", json={"turns": turns}, headers=h).status_code == 200
    assert http.delete(url + "/v1/banks/acme-fg/turns/f1", headers=_auth("ro")).status_code == 404  # not its bank
    r = http.delete(url + "/v1/banks/acme-fg/turns/f1", headers=h)
    assert r.status_code == 200 and r.json()["forgotten"] == ["f1"] and r.json()["n_units"] == 1
    q = {"bank_id": "acme-fg", "question": "What is the locker code?"}
    for _ in range(6):  # each on its own connection: both fronts answer from the engine process
        with httpx.Client(timeout=120) as c:
            assert [u["id"] for u in c.post(url + "/v1/select", json=q, headers=h).json()["units"]] == ["f2"]
    r = http.delete(url + "/v1/banks/acme-fg", headers=h)
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert http.delete(url + "/v1/banks/acme-fg", headers=h).status_code == 404  # UnknownBank crossed the socket
    for _ in range(4):
        with httpx.Client(timeout=120) as c:
            assert c.get(url + "/v1/banks/acme-fg", headers=h).status_code == 404
    from trawmem_gpu.store import Collection

    assert "acme-fg" not in Collection(coll)


def test_metrics_are_summed_over_fronts_and_include_the_engine(fronts):
    url, _, _ = fronts

    def count(text):
        m = re.search(r'trawmem_http_requests_total\{method="GET",route="/healthz",status="200"\} ([0-9.]+)', text)
        return float(m.group(1)) if m else 0.0

    before = count(http.get(url + "/metrics").text)
    for _ in range(12):
        with httpx.Client(timeout=120) as c:  # new connections: both fronts answer some
            assert c.get(url + "/healthz").status_code == 200
    text = http.get(url + "/metrics").text
    assert count(text) == before + 12
    assert "trawmem_batch_size_count" in text and "trawmem_queue_depth" in text
    families = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert len(families) == len(set(families)), "a metric family is exposed twice"


def test_errors_cross_the_socket_as_the_same_classes():
    from trawmem_gpu.errors import InputError
    from trawmem_gpu.serve.batcher import DeadlineExceeded, QueueFull, ShuttingDown
    from trawmem_gpu.errors import DuplicateTurns
    from trawmem_gpu.serve.remote import error_fields, error_from
    from trawmem_gpu.errors import UnknownBank

    for e in (QueueFull(7), DeadlineExceeded("late"), ShuttingDown("bye"), UnknownBank("b1", "requests[3]: "),
              DuplicateTurns("turn ids already held: t1"), InputError("bad turn")):
        back = error_from(error_fields(e))
        assert type(back) is type(e) and str(back) == str(e)
    assert error_from(error_fields(QueueFull(7))).retry_after == 7
    internal = error_from(error_fields(ZeroDivisionError("secret detail")))
    assert isinstance(internal, RuntimeError) and "secret" not in str(internal)


def test_frames_round_trip_and_refuse_a_huge_length():
    from trawmem_gpu.serve import remote

    async def go():
        r = asyncio.StreamReader()
        obj = (3, "select", ([np.arange(5.0)], False))
        r.feed_data(remote.frame([obj]))
        ((rid, op, args),) = await remote.read_frame(r)
        assert (rid, op) == (3, "select") and np.array_equal(args[0][0], obj[2][0][0])
        bad = asyncio.StreamReader()
        bad.feed_data(remote._LEN.pack(remote.MAX_FRAME + 1))
        with pytest.raises(ConnectionError, match="limit"):
            await remote.read_frame(bad)

    asyncio.run(go())


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc")
def test_shutdown_ends_every_process(fronts):
    url, proc, _ = fronts
    children = _children(proc.pid)
    assert len(children) >= 2  # the two fronts (and multiprocessing's resource tracker)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(600) == 0
    proc.reader.join(60)  # the output's end (bounded)
    rest = "".join(proc.lines)
    assert "SIGTERM: draining" in rest and rest.rstrip().endswith("trawmem serve: stopped"), rest[-2000:]
    t0 = time.monotonic()  # the children may take a moment longer on a loaded machine: bounded wait
    while time.monotonic() - t0 < 120 and any(_alive(c) for c in children):
        time.sleep(0.2)
    assert not [c for c in children if _alive(c)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc")
def test_fronts_exit_when_the_engine_process_dies(tmp_path):
    """A killed engine process leaves no front serving on its own."""
    coll = build_sample_collection(tmp_path / "coll")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(coll), "--port", "0",
                             "--http-workers", "1", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        t0, fronts = time.monotonic(), []
        while time.monotonic() - t0 < 180:
            line = proc.stdout.readline()
            if "HTTP front processes (pids" in line:
                fronts = [int(x) for x in re.search(r"pids ([0-9, ]+)\)", line).group(1).split(", ")]
                break
            assert line or proc.poll() is None, "server exited before starting its fronts"
        assert fronts
        proc.kill()
        proc.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and any(_alive(p) for p in fronts):
            time.sleep(0.2)
        assert not any(_alive(p) for p in fronts)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def _start(coll: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`trawmem serve --http-workers N` over ``coll`` on a free port: (process, url) once ready."""
    proc, url, _ = serve_command(coll, *args, bound_s=180)
    return proc, url


def test_kill_9_mid_append_answers_outcome_unknown_and_a_resend_is_safe(tmp_path):
    """The engine process is killed after the first of six appends to one bank was stored, the
    others in flight: each is answered 200 or 503 with "outcome": "unknown" (never a plain "not
    done"); after a restart, resending every append is 200 and reports what was stored already,
    and each turn is stored exactly once."""
    coll = build_sample_collection(tmp_path / "coll")
    bodies = [{"turns": [_turn(f"k{r}-{i}", f"Note {i} of batch {r} about the garden.") for i in range(40)]}
              for r in range(6)]
    proc, url = _start(coll, "--http-workers", "2")
    n0 = http.get(url + f"/v1/banks/{SAMPLE_BANK}", timeout=30).json()["n_units"]
    try:
        def append(body):
            try:
                with httpx.Client(timeout=300) as c:
                    return c.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json=body)
            except httpx.HTTPError as e:  # the front went away before answering
                return e

        def stored() -> int:
            try:
                return http.get(url + f"/v1/banks/{SAMPLE_BANK}", timeout=10).json()["n_units"] - n0
            except (httpx.HTTPError, KeyError, ValueError):
                return 0

        with ThreadPoolExecutor(6) as ex:
            futs = [ex.submit(append, b) for b in bodies]
            t0 = time.monotonic()
            while stored() < 40 and time.monotonic() - t0 < 120:  # appends to one bank run one by one
                time.sleep(0.05)
            proc.kill()  # kill -9 of the engine process, the other appends in flight
            proc.wait()
            first = [f.result() for f in futs]
    finally:
        if proc.poll() is None:
            proc.kill()
    answered = [r for r in first if isinstance(r, httpx.Response)]
    assert answered and all(r.status_code == 200 or (r.status_code == 503 and r.json().get("outcome") == "unknown")
                            for r in answered), [(r.status_code, r.text[:200]) for r in answered]
    assert any(r.status_code == 503 for r in answered)
    proc, url = _start(coll, "--http-workers", "1")  # the same collection, restarted
    try:
        with httpx.Client(timeout=300) as c:
            again = [c.post(url + f"/v1/banks/{SAMPLE_BANK}/turns", json=b) for b in bodies]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    for b, r0, r in zip(bodies, first, again):
        ids = [t["turn_id"] for t in b["turns"]]
        assert r.status_code == 200 and sorted(r.json()["stored"] + r.json()["already_stored"]) == sorted(ids)
        if isinstance(r0, httpx.Response) and r0.status_code == 200:
            assert r.json()["already_stored"] == ids
    assert sum(len(r.json()["already_stored"]) for r in again) >= 40  # the first append was stored before the kill
    from trawmem_gpu.store import Collection

    held = [t.turn_id for t in Collection(coll).load(SAMPLE_BANK).turns]
    assert all(held.count(t["turn_id"]) == 1 for b in bodies for t in b["turns"])
    print("kill -9 mid-append:", [getattr(r, "status_code", type(r).__name__) for r in first],
          "resent: already_stored", [len(r.json()["already_stored"]) for r in again])
