"""HTTP in front processes, selection in one engine process: ``trawmem serve --http-workers N``.

In one process, HTTP parsing, key checks, validation and JSON share one GIL with the engine
and the workspace assembly, and with client-supplied vectors the HTTP side costs about as much
per query as the engine (``benchmarks/bench_serve.py``; docs/design-notes.md). With
``--http-workers N``:

* the **engine process** (the command's own) owns the :class:`~.service.SelectionService`
  (banks, encoder, dynamic batcher, appends and their single writer) and answers on a private
  Unix socket (:class:`EngineEndpoint`; the socket sits in a fresh 0700 directory);
* **N front processes** (spawned) each run the same FastAPI app (:func:`~.app.create_app`,
  unchanged: keys, validation, routes, errors) over a :class:`RemoteBackend` that forwards each
  backend call as one frame, and all accept on the one listening socket the engine process bound.

The engine's batcher coalesces the queries of all fronts. Frames (:mod:`.wire`) are a 4-byte
length and a pickle (both ends are this package's processes, on a socket only this user can reach) of a
list: the calls (or answers) one side made in one event-loop iteration, so a batch's answers
cross in one write. Each call carries an id, so answers come back in any order on one
connection per front. Each call's arguments (and each answer) are pickled on their own inside
the frame: one that fails to pickle or unpickle fails that call only (:class:`EngineCallFailed`,
500 naming the failure, or the error it raised, e.g. an ``InputError``'s 422), never the
connection or the server. Errors
cross as (kind, fields) and are raised again in the front as the same exception classes, so a
client sees the same statuses (404, 409, 422, 429, 503, 504) as from one process. An append
or a forget whose answer does not come back (the engine process died, or did not answer in time)
may have been done: it fails with :class:`~.batcher.OutcomeUnknown` (503, ``"outcome": "unknown"``),
and the client's retry is safe (the registry reports the turns it holds already, a forget the
turns it no longer holds).

Metrics: each front counts its HTTP requests in ``prometheus_client``'s multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` in the same private directory), summed at each scrape; the engine
process's families (batches, assembly, queue depth, appends) come over the socket.

A front whose connection to the engine closes fails the calls it had in flight there (503) and
connects again; only when the engine process does not answer (it died) does the front exit.
The processes themselves (the fronts started, restarted and stopped, the engine's load while
its fronts already answer) are :mod:`.fronts`'.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import pickle
import signal

from ..aio import within
from ..select.params import QueryParams
from .backend import CALLS, Backend, LocalBackend
from .portable import joined, regrouped
from .batcher import DeadlineExceeded, OutcomeUnknown, ShuttingDown
from .config import ServeConfig
from .loading import LOADING
from .wire import _LEN, MAX_FRAME, EngineCallFailed, Outbox as _Outbox, blob as _blob, error_fields, error_from, \
    frame, read_frame  # noqa: F401 - the wire's names, read from here too

log = logging.getLogger(__name__)

WRITE_WAIT_S = 600.0
"""Longest a front waits for the engine's answer to a write (an append or a forget: a large one on
a busy host takes minutes, and the engine bounds neither by ``timeout_s``; a dead engine is
noticed at once, by its socket closing); then OutcomeUnknown."""
STATE = "state"
"""The one engine call besides :data:`~.backend.CALLS`: the backend's state attributes (polled)."""
WRITES = {"append": "stored; resend the same turns (turns already stored are reported in already_stored, "
                    "not stored twice)",
          "forget": "done; resend it (turns already forgotten are reported in missing)",
          "import_bank": "stored; resend it (turns already stored are reported in already_stored)"}
"""The calls whose lost answer is OutcomeUnknown, with what the client is told of it."""
RECONNECTS = 5
"""Attempts (0.2 s apart) a front makes to connect again to the engine when its connection closed."""
NEXT, CLOSE = "stream_next", "stream_close"
"""The engine calls that read a streamed answer (an export's pieces) and end it early."""
STREAM_BYTES = 1 << 18
"""About how many bytes of a streamed answer cross per :data:`NEXT` call (``portable.regrouped``)."""


class Streamed:
    """The engine's answer to a call whose result is an async iterator (an export): its pieces stay
    in the engine process and cross :data:`STREAM_BYTES` at a time as the front asks for them
    (:meth:`RemoteBackend._stream`), so neither process holds the whole export."""

    def __init__(self, sid: int):
        self.sid = sid


class EngineEndpoint:
    """The engine process's side: a :class:`~.service.SelectionService` on a Unix socket, each
    call answered by the :class:`~.backend.LocalBackend` over it (the table :data:`~.backend.CALLS`).

    It may start before the service exists (``service`` None: the engine process listens while
    it loads): its ``state`` then answers not ready with :attr:`loading` (what is loading), every
    other call :class:`~.batcher.ShuttingDown` (503 ``not ready: ...``), until :meth:`attach`."""

    def __init__(self, service, path: str, metrics=None):
        self.service, self.path, self.metrics = None, path, metrics
        self.backend: LocalBackend | None = None
        self.loading = LOADING
        self.server: asyncio.AbstractServer | None = None
        self.connected = asyncio.Event()
        """Set once a front has connected (it is then about to accept: the URL can be said)."""
        self._tasks: set[asyncio.Task] = set()
        if service is not None:
            self.attach(service)

    def attach(self, service) -> None:
        """Serve ``service`` (loaded; ready once its warm-up is done: ``service.ready``)."""
        self.service, self.loading = service, "warming up"
        self.backend = LocalBackend(service, self.metrics)  # its metrics_text: the engine's families, for the fronts
        if self.metrics is not None and self.metrics.queue_depth is not None:
            self.metrics.queue_depth.set_function(lambda: float(service.queue_depth()))

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._connection, path=self.path)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        out, streams = _Outbox(writer), {}
        self.connected.set()
        try:
            while True:
                for rid, op, blob in await read_frame(reader):
                    t = asyncio.ensure_future(self._answer(out, rid, op, blob, streams))
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the front went away
        except asyncio.CancelledError:  # the engine shuts down: end quietly, not as a cancelled task
            pass  # (CPython 3.11's stream callback asks a cancelled handler for its exception and logs it)
        except Exception:  # noqa: BLE001 - a bad frame ends that connection only
            log.exception("bad frame from a front process; closing its connection")
        finally:
            writer.close()
            for it in list(streams.values()):  # the front's streams end with its connection
                await _aclose(it)
            streams.clear()

    async def _answer(self, out: "_Outbox", rid: int, op: str, blob: bytes, streams: dict) -> None:
        """One call: its arguments unpickled here, so one that fails (a value that does not
        unpickle) is that call's error, answered like any other. ``streams``: this connection's
        streamed answers (:class:`Streamed`), read by :data:`NEXT` and ended by :data:`CLOSE`."""
        try:
            if op in (NEXT, CLOSE):
                ok, payload = True, await _stream_call(streams, op, *pickle.loads(blob))
            else:
                ok, payload = True, await self._call(op, pickle.loads(blob))
                if hasattr(payload, "__aiter__"):  # an export: its pieces cross as the front asks
                    sid = max(streams, default=-1) + 1
                    streams[sid], payload = regrouped(payload, STREAM_BYTES), Streamed(sid)
        except Exception as e:  # noqa: BLE001 - answered to the front, which raises it again
            if error_fields(e)[0] == "internal":
                log.exception("engine call %s failed", op)
            ok, payload = False, error_fields(e)
        out.answer(rid, ok, payload)

    async def _call(self, op: str, args: tuple):
        """``op`` of :data:`~.backend.CALLS` on the service's :class:`~.backend.LocalBackend`, or
        ``"state"``: the backend's state attributes, which a front polls (not ready, with what is
        loading, until :meth:`attach`)."""
        b = self.backend
        if op not in CALLS and op != STATE:
            raise ValueError(f"unknown engine call {op!r}")
        if b is None:  # still loading: only the state and the metrics are answered
            if op == STATE:
                return {"ready": False, "queue_depth": 0, "dim": 0, "encoder_id": None, "defaults": QueryParams(),
                        "loading": self.loading}
            if op == "metrics_text":
                return self.metrics.render() if self.metrics is not None else b""
            raise ShuttingDown(f"not ready: {self.loading}")
        if op == STATE:
            return {"ready": b.ready, "queue_depth": b.queue_depth(), "dim": b.dim, "encoder_id": b.encoder_id,
                    "defaults": b.defaults, "loading": None if b.ready else self.loading}
        return await getattr(b, op)(*args)


async def _stream_call(streams: dict, op: str, sid: int) -> bytes | None:
    """:data:`NEXT`: the next piece of stream ``sid`` (``b""`` at its end, when it is dropped);
    :data:`CLOSE`: end it now (a front whose reader went away)."""
    it = streams.get(sid)
    if op == CLOSE:
        if it is not None:
            del streams[sid]
            await _aclose(it)
        return None
    if it is None:
        raise ValueError(f"no stream {sid} on this connection (it ended, or the engine restarted)")
    try:
        return await it.__anext__()
    except StopAsyncIteration:
        del streams[sid]
        return b""
    except BaseException:
        streams.pop(sid, None)
        await _aclose(it)
        raise


async def _aclose(it) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - a stream that fails to close is dropped all the same
            log.exception("closing a streamed answer failed")


class _EngineLost(ShuttingDown):
    """A call's answer will not come: the engine's socket closed."""


class RemoteBackend:
    """The app's :class:`~.backend.Backend` in a front process: every call goes to the engine
    process (its methods are made from the table :data:`~.backend.CALLS`, below the class)."""

    POLL_S = 0.5
    """How often readiness and queue depth are refreshed (``/readyz``, ``Retry-After``)."""

    def __init__(self, path: str, cfg: ServeConfig, on_engine_lost=None):
        """:param on_engine_lost: called when the engine's socket closes (default: SIGTERM to this
        front, which then shuts down: no orphans)"""
        self.path, self.cfg = path, cfg
        self.on_engine_lost = on_engine_lost or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.dim, self.encoder_id, self.defaults = 0, None, QueryParams()
        self._engine_ready, self._depth = False, 0
        self.loading: str | None = None
        """What the engine process is loading, while it says it is not ready (its ``state``)."""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._connected: asyncio.Event | None = None  # set while connected to the engine
        self._out: _Outbox | None = None
        self._next = 0
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    @property
    def ready(self) -> bool:
        return self._engine_ready and self._writer is not None and not self._writer.is_closing()

    def queue_depth(self) -> int:
        return self._depth

    async def start(self) -> None:
        await self._connect()
        self._tasks.append(asyncio.ensure_future(self._read_answers()))
        self._apply(await self._call(STATE))
        self._tasks.append(asyncio.ensure_future(self._poll()))

    async def stop(self) -> None:
        self._stopping, self._engine_ready = True, False
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
        self._fail_pending("the server is shutting down")

    def _apply(self, st: dict) -> None:
        self._engine_ready, self._depth = bool(st["ready"]), int(st["queue_depth"])
        self.dim, self.encoder_id, self.defaults = int(st["dim"]), st["encoder_id"], st["defaults"]
        self.loading = st.get("loading")

    async def refresh(self) -> bool:
        """Read the engine's state now (not at the next poll); whether it is ready. A front that
        has not switched to the app yet asks this before it answers 503 "not ready", so a request
        that follows another front's ``/readyz`` 200 is served, not refused for a stale state."""
        try:
            self._apply(await self._call(STATE))
        except Exception:  # noqa: BLE001 - not ready until the engine answers again
            self._engine_ready = False
        return self.ready

    async def _poll(self) -> None:
        while not self._stopping:  # as well as cancelled by stop (a lost cancellation must not keep it)
            await asyncio.sleep(self.POLL_S)
            await self.refresh()

    async def _stream(self, sid: int):
        """The pieces of the engine's streamed answer ``sid``, asked for as they are read; the
        engine's side is ended (:data:`CLOSE`) when the reader stops early."""
        done = False
        try:
            while data := await self._call(NEXT, sid):
                yield data
            done = True
        finally:
            if not done and self._writer is not None and not self._writer.is_closing():
                try:
                    await self._call(CLOSE, sid)
                except Exception:  # noqa: BLE001 - the connection's end drops it as well
                    pass

    def _fail_pending(self, why: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(_EngineLost(why))
        self._pending.clear()

    def _lost(self, op: str, e: Exception) -> Exception:
        """What a call whose answer never came raises: for a write (append, forget), OutcomeUnknown
        (it may have been done); for anything else (reads, selections) the error as it was."""
        if op not in WRITES:
            return e
        return OutcomeUnknown(f"the {op}'s outcome is unknown ({e}): it may or may not have been {WRITES[op]}")

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(self.path)
        self._out = _Outbox(self._writer)
        if self._connected is None:
            self._connected = asyncio.Event()
        self._connected.set()

    async def _read_answers(self) -> None:
        """Answers from the engine, for as long as it lives: when the connection closes, the
        calls in flight on it fail (503) and the front connects again; when the engine does not
        accept (it is gone), this front shuts down too (no orphans)."""
        while True:
            try:
                await self._read_connection()
            except Exception as e:  # noqa: BLE001 - the connection is lost, whatever broke it
                if not self._stopping:
                    log.error("the connection to the engine process closed (%s)", type(e).__name__)
            ready, self._engine_ready = self._engine_ready, False
            self._connected.clear()
            if self._writer is not None:
                self._writer.close()  # later calls fail at once (503), not at the deadline
            self._fail_pending("the engine process is not answering")
            if self._stopping:
                return
            for _ in range(RECONNECTS):
                try:
                    await self._connect()
                    break
                except OSError:
                    await asyncio.sleep(0.2)
            else:
                self._connected.set()  # waiting calls see the closed connection: 503 at once
                self.on_engine_lost()
                return
            log.warning("connected again to the engine process")
            self._engine_ready = ready

    async def _read_connection(self) -> None:
        while True:
            for rid, ok, blob in await read_frame(self._reader):
                fut = self._pending.pop(rid, None)
                if fut is None or fut.done():
                    continue
                try:
                    payload = pickle.loads(blob)
                except Exception as e:  # noqa: BLE001 - this call fails, not the connection
                    fut.set_exception(EngineCallFailed(f"the engine's answer did not unpickle ({type(e).__name__})"))
                    continue
                if ok:
                    fut.set_result(payload)
                else:
                    fut.set_exception(error_from(payload))

    async def _call(self, op: str, *args):
        if self._connected is not None and not self._connected.is_set() and not self._stopping:
            try:  # connecting again (RECONNECTS attempts 0.2 s apart): wait for it, as long as for an answer
                await within(self._connected.wait(), self.cfg.timeout_s + 5.0)
            except asyncio.TimeoutError:
                pass
        w = self._writer
        if w is None or w.is_closing():
            raise ShuttingDown("the engine process is not answering")
        rid = self._next
        self._next += 1
        try:
            blob = _blob(args)
        except Exception as e:  # noqa: BLE001 - a call that cannot cross fails alone
            raise EngineCallFailed(f"the {op} call could not be sent to the engine process "
                                   f"({type(e).__name__})") from None
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._out.put((rid, op, blob))
        wait_s = WRITE_WAIT_S if op in WRITES else self.cfg.timeout_s + 5.0
        try:  # the engine enforces --timeout itself; this bounds a stuck engine process
            res = await within(fut, wait_s)
            return self._stream(res.sid) if isinstance(res, Streamed) else res
        except asyncio.TimeoutError:
            raise self._lost(op, DeadlineExceeded(f"no answer from the engine process within {wait_s:g} s")) from None
        except _EngineLost as e:  # sent, then the engine went away: an append may have been stored
            raise self._lost(op, e) from None
        finally:
            self._pending.pop(rid, None)


def _forward(name: str):
    """The :class:`RemoteBackend` method of the backend call ``name``: the :class:`~.backend.Backend`
    method's parameters and defaults, its arguments sent in that order to the engine process.

    Written as source from the Protocol's signature and compiled once (as ``dataclasses`` makes
    ``__init__``), so a call costs what a method written out costs, and Python itself refuses a
    wrong argument; ``Signature.bind`` on each call cost several µs a request."""
    proto = getattr(Backend, name)
    params = list(inspect.signature(proto).parameters.values())[1:]  # after self
    head = ", ".join(["self", *(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}" for p in params)])
    ns = {f"_default_{p.name}": p.default for p in params if p.default is not p.empty}
    exec(f"async def {name}({head}):\n    return await self._call({name!r}{''.join(', ' + p.name for p in params)})",
         ns)  # noqa: S102 - source made here from the Protocol's parameter names, nothing else
    call = functools.wraps(proto)(ns[name])
    call.__qualname__ = f"RemoteBackend.{name}"
    return call


for _name in CALLS:  # one table: every backend call, forwarded by name (the engine answers it: EngineEndpoint._call)
    setattr(RemoteBackend, _name, _forward(_name))
del _name


async def _import_bank(self, bank_id: str, body, where=None, quota=None) -> dict:
    """The forwarded ``import_bank``, its body's lines gathered first (they cross whole)."""
    return await self._call("import_bank", bank_id, await joined(body), where, quota)


RemoteBackend.import_bank = functools.wraps(Backend.import_bank)(_import_bank)
