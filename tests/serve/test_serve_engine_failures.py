"""No request stops a ``trawmem serve --http-workers N`` server (issue 42 item 1).

A call whose arguments do not unpickle in the engine process (``{"not": {}}`` once pickled to a
filter the engine refused: the engine dropped the front's connection, the front exited and the
whole server stopped), or whose answer does not pickle, fails alone; a front whose connection
closes connects again; a front process that dies is started again. The wire in one process
(a fake service behind the real endpoint), then the real command.
"""
from __future__ import annotations

import asyncio
import glob
import os
import pickle
import re
import signal
import tempfile

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import KEYS, SAMPLE_BANK, build_sample_collection, keys_file, serve_command  # noqa: E402
from trawmem_gpu.data.filters import parse_filter  # noqa: E402
from trawmem_gpu.errors import InputError  # noqa: E402
from trawmem_gpu.serve.batcher import ShuttingDown  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.remote import EngineEndpoint, RemoteBackend  # noqa: E402
from trawmem_gpu.serve.wire import EngineCallFailed, blob, frame, read_frame  # noqa: E402


def _bad_filter():
    """A filter whose pickle the engine refuses: the state ``{"not": {"and": []}}`` that
    ``{"not": {}}`` once pickled to."""
    f = parse_filter({"a": 1})
    f.json = {"not": {"and": []}}
    return f


class _Service:
    """The engine's service, faked: a select answers its items' count, or something that does
    not pickle for the item ``"unpicklable"``."""

    ready, dim, encoder_id = True, 4, "fake"

    def __init__(self):
        from trawmem_gpu.select.params import QueryParams

        self.defaults = QueryParams()

    def queue_depth(self) -> int:
        return 0

    async def select(self, items, batch=False, quota=None):
        return [lambda: 0] if items == ["unpicklable"] else [{"n": len(items)}]


def test_a_call_that_cannot_cross_fails_alone():
    """Arguments that do not unpickle in the engine: that call's error (the InputError itself, a
    422); an answer that does not pickle: EngineCallFailed naming it (500); the calls after them
    on the same connection are answered, and the front never loses the engine."""
    path = os.path.join(tempfile.mkdtemp(prefix="tm-fail-"), "e.sock")
    lost = []

    async def main():
        endpoint = EngineEndpoint(_Service(), path)
        await endpoint.start()
        be = RemoteBackend(path, ServeConfig(), on_engine_lost=lambda: lost.append(1))
        await be.start()
        out = []
        for items in (["x"], [_bad_filter()], ["unpicklable"], ["x", "y"]):
            try:
                out.append(await be.select(items))
            except Exception as e:  # noqa: BLE001
                out.append(e)
        await be.stop()
        await endpoint.close()
        return out

    ok1, bad_args, bad_answer, ok2 = asyncio.run(main())
    assert ok1 == [{"n": 1}] and ok2 == [{"n": 2}]
    assert isinstance(bad_args, InputError) and "where.not.and" in str(bad_args)
    assert isinstance(bad_answer, EngineCallFailed) and "server goes on" in str(bad_answer)
    assert lost == []


def test_a_front_whose_connection_closes_connects_again():
    """The engine drops a front's connection during a select: that select fails (503), the front
    connects again and the next one is answered; once the engine is gone, the front gives up
    (on_engine_lost: it shuts down, no orphan)."""
    path = os.path.join(tempfile.mkdtemp(prefix="tm-drop-"), "e.sock")
    lost, dropped = [], []

    async def engine(reader, writer):
        while True:
            try:
                msgs = await read_frame(reader)
            except Exception:  # noqa: BLE001
                return
            for rid, op, args in msgs:
                if op == "select" and not dropped:
                    dropped.append(rid)
                    writer.close()  # the first select kills its connection
                    return
                answer = {"ready": True, "queue_depth": 0, "dim": 4, "encoder_id": "f", "defaults": _Service().defaults}
                writer.write(frame([(rid, True, blob(answer if op == "state" else [{"n": 1}]))]))

    async def main():
        srv = await asyncio.start_unix_server(engine, path=path)
        be = RemoteBackend(path, ServeConfig(), on_engine_lost=lambda: lost.append(1))
        await be.start()
        out = []
        for _ in range(2):
            try:
                out.append(await be.select(["x"]))
            except Exception as e:  # noqa: BLE001
                out.append(e)
        assert lost == []
        srv.close()
        await srv.wait_closed()
        os.unlink(path)
        be._writer.close()  # noqa: SLF001 - the engine is gone: this connection ends too
        for _ in range(600):  # a bound on a hang: the front tries to connect again, then gives up
            if lost:
                break
            await asyncio.sleep(0.05)
        await be.stop()
        return out

    first, second = asyncio.run(main())
    assert isinstance(first, ShuttingDown) and second == [{"n": 1}]
    assert lost == [1]


def _start(tmp, coll):
    """`trawmem serve --http-workers 1` with the tenant keys, its temporary files under ``tmp``
    (to find the engine's socket): (process, url, output lines, the front's pid)."""
    proc, url, lines = serve_command(coll, "--http-workers", "1", "--keys", keys_file(tmp / "keys.json"),
                                     env={"TMPDIR": str(tmp)}, bound_s=180)
    pids = [m.group(1) for ln in list(lines) for m in [re.search(r"pids (\d+)\)", ln)] if m]
    return proc, url, lines, int(pids[0])


def test_no_request_stops_the_server(tmp_path):
    """Over the real command: the 60-byte filters that stopped it are answered; a call that fails
    inside the engine fails alone; a killed front is started again; every time, another tenant's
    select after it is answered."""
    coll = build_sample_collection(tmp_path / "coll", extra_ids=("acme-a",))
    proc, url, lines, front = _start(tmp_path, coll)
    acme, other = ({"Authorization": f"Bearer {KEYS[k]}"} for k in ("rw", "other"))
    q = {"bank_id": "acme-a", "question": "Where does Clara live now?"}

    def other_select():
        r = httpx.post(url + "/v1/select", json={**q, "bank_id": SAMPLE_BANK}, headers=other, timeout=120)
        assert r.status_code == 200 and r.json()["units"], r.text

    try:
        none = httpx.post(url + "/v1/select", json={**q, "where": {"not": {}}}, headers=acme, timeout=120)
        assert none.status_code == 200 and none.json()["units"] == [], none.text  # {} holds for all: not, for none
        every = httpx.post(url + "/v1/select", json={**q, "where": {"and": [{}]}}, headers=acme, timeout=120)
        assert every.status_code == 200 and every.json()["units"], every.text
        other_select()
        # a 3 MB filter of empty objects (it once parsed for 21 s): refused unread, over a single
        # select's byte bound; a 400 kB one is parsed and refused by the filter's size, naming the bound
        big = httpx.post(url + "/v1/select", json={**q, "where": {"and": [{}] * 1_000_000}}, headers=acme, timeout=120)
        assert big.status_code == 413 and "limit of a single select" in big.json()["detail"], big.text
        big = httpx.post(url + "/v1/select", json={**q, "where": {"and": [{}] * 100_000}}, headers=acme, timeout=120)
        assert big.status_code == 422 and big.json()["detail"] == "where: the filter is over 65536 bytes as JSON " \
                                                                  "(the limit)", big.text
        # a call that fails inside the engine, on the engine's own socket: answered alone
        (sock_path,) = glob.glob(str(tmp_path / "trawmem-serve-*" / "engine.sock"))

        async def raw():
            reader, writer = await asyncio.open_unix_connection(sock_path)
            writer.write(frame([(1, "select", blob(([_bad_filter()], False, None))), (2, "select", b"garbage"),
                                (3, "state", blob(()))]))
            got = {}
            while len(got) < 3:
                for rid, ok, data in await read_frame(reader):
                    got[rid] = (ok, pickle.loads(data))
            writer.close()
            return got

        got = asyncio.run(asyncio.wait_for(raw(), 120))
        assert got[1][0] is False and got[1][1][0] == "input" and "where.not.and" in got[1][1][1]
        assert got[2] == (False, ("internal", "UnpicklingError")) and got[3][0] is True
        other_select()
        # the front process dies: started again; the next request waits for it, then is answered
        os.kill(front, signal.SIGKILL)
        other_select()
        assert any("started again" in ln and f"pid {front})" in ln for ln in lines), "".join(lines[-5:])
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(300)
    assert code == 0 and "trawmem serve: stopped" in "".join(lines[-3:]), "".join(lines[-10:])


def test_a_front_asks_the_engine_afresh_before_answering_not_ready():
    """Fronts poll the engine's state apart (``RemoteBackend.POLL_S``): once the engine is ready, a
    front that has not polled since must still serve, not answer 503 "not ready" for a stale state
    (CI: a GET after another front's ``/readyz`` 200 met a front still warming up). Here the poll
    never comes (an hour): the request after the engine turns ready is served by the app."""
    import contextlib

    from fastapi import FastAPI

    from trawmem_gpu.serve.loading import loading_front

    path = os.path.join(tempfile.mkdtemp(prefix="tm-ready-"), "e.sock")
    service = _Service()
    service.ready = False  # warming up

    async def main():
        endpoint = EngineEndpoint(service, path)
        await endpoint.start()
        be = RemoteBackend(path, ServeConfig(), on_engine_lost=lambda: None)
        be.POLL_S = 3600.0

        @contextlib.asynccontextmanager
        async def lifespan(_app):
            await be.start()
            yield
            await be.stop()

        app = FastAPI(lifespan=lifespan)
        app.get("/v1/x")(lambda: {"served": True})
        front = loading_front(app, be)
        await front.startup()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://t") as c:
            before = await c.get("/v1/x")
            service.ready = True
            after = await c.get("/v1/x")
        await front.lifespan.__aexit__(None, None, None)
        await endpoint.close()
        return before, after

    before, after = asyncio.run(main())
    assert before.status_code == 503 and "warming up" in before.json()["detail"]
    assert after.status_code == 200 and after.json() == {"served": True}
