"""The processes of ``trawmem serve --http-workers N`` (:mod:`.remote` is the wire between them):
the engine process (the command's own) and its N spawned front processes, which all accept on
the one listening socket the engine process bound.

The server listens before it loads: the engine process binds the socket, starts its endpoint and
the fronts, and says its URL once a front is up; then it loads the collection and the encoder
on a thread and warms up. Meanwhile its endpoint answers the fronts' ``state`` "not ready" (with
what is loading) and every front answers ``/healthz`` 200, ``/readyz`` 503 and every other route
503 ``not ready: loading ...`` with ``Retry-After`` (``loading.loading_front``), until the engine
is ready; from then on a front serves the app. A load that fails stops the fronts and the
command with its error.

A front process that dies is started again by the engine process (at most :data:`FRONT_RESTARTS`
times in :data:`FRONT_RESTART_WINDOW_S`: a front that cannot start at all stops the server).

Shutdown (SIGINT / SIGTERM to the engine process, or Ctrl-C to the group): the fronts stop
accepting and answer what they hold, the engine keeps serving them until they have exited,
then drains its own batcher.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import tempfile

from ..aio import within
from ..notes import Say
from .config import ServeConfig, bound_socket, log_line, say_draining, uvicorn_config
from .remote import EngineEndpoint, RemoteBackend

log = logging.getLogger(__name__)

FRONT_RESTARTS, FRONT_RESTART_WINDOW_S = 5, 60.0
"""A dead front process is started again, unless this many died within this many seconds."""


def run_front(cfg: ServeConfig, path: str, sock: socket.socket, access_log: bool) -> None:
    """A front process: the app over :class:`RemoteBackend`, on the shared listening socket.
    ``PROMETHEUS_MULTIPROC_DIR`` is in its environment from the start (set by the engine process
    before spawning), so its HTTP metrics go to the shared files."""
    os.setpgrp()  # out of the terminal's group: Ctrl-C reaches the engine process, which stops the fronts in order
    import uvicorn

    from .app import create_app
    from .keys import KeyStore
    from .metrics import Metrics
    from .loading import loading_front

    prom_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    keys = KeyStore.load(cfg.keys_file) if cfg.keys_file else None
    backend = RemoteBackend(path, cfg)
    app = create_app(backend, cfg, keys, Metrics("http", multiprocess_dir=prom_dir))
    try:  # 503 "not ready" while the engine process loads (loading_front), then the app
        uvicorn.Server(uvicorn_config(loading_front(app, backend), cfg, access_log)).run(sockets=[sock])
    finally:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid(), prom_dir)


def listening_socket(sock: socket.socket) -> socket.socket:
    """The one socket every front accepts on (``config.bound_socket``, bound once, so ``--port 0``
    gets a port once), listening and inheritable."""
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _restart_dead(fronts: list, deaths: list[float], now: float, spawn, prom_dir: str, say: Say) -> bool:
    """Start again (in place in ``fronts``) each front process that died, noting when in
    ``deaths``; False (stop the server) once more than :data:`FRONT_RESTARTS` died within
    :data:`FRONT_RESTART_WINDOW_S` (a front that cannot start at all)."""
    from prometheus_client import multiprocess

    for i, p in enumerate(fronts):
        if p.is_alive():
            continue
        deaths[:] = [t for t in deaths if now - t < FRONT_RESTART_WINDOW_S] + [now]
        if len(deaths) > FRONT_RESTARTS:
            log.error("front process %s exited (code %s), %d in %g s; shutting down", p.name, p.exitcode,
                      len(deaths), FRONT_RESTART_WINDOW_S)
            return False
        multiprocess.mark_process_dead(p.pid, prom_dir)  # its live gauges go; its counts stay summed
        fronts[i] = spawn(p.name)
        say(f"trawmem serve: front process {p.name} (pid {p.pid}) exited (code {p.exitcode}); started again "
            f"(pid {fronts[i].pid})")
    return True


async def _bring_up(load, endpoint: EngineEndpoint, stop: asyncio.Event):
    """The service ``load()`` builds (on a thread: meanwhile the endpoint answers its fronts'
    state, not ready, and they answer 503), attached to ``endpoint`` and started (its warm-up);
    None when ``stop`` was set during the load (no warm-up for a server that is stopping)."""
    service = await asyncio.get_running_loop().run_in_executor(None, load)
    if stop.is_set():
        return None
    endpoint.attach(service)
    await service.start()
    return service


async def _supervise(stop: asyncio.Event, endpoint: EngineEndpoint, bring_up: asyncio.Task, restart,
                     announce) -> None:
    """Until ``stop`` is set or the load failed: ``announce()`` once a front has connected to the
    engine (it accepts right after), and ``restart()`` the dead fronts (False: stop the server)."""
    announced = False
    while not stop.is_set():
        if not announced and endpoint.connected.is_set():
            announce()
            announced = True
        if bring_up.done() and bring_up.exception() is not None:
            return
        try:
            await within(stop.wait(), 0.5 if announced else 0.05)
        except asyncio.TimeoutError:
            if not restart():
                stop.set()


async def _engine_main(cfg: ServeConfig, load, metrics, announce, access_log: bool, sock: socket.socket, say: Say,
                       workdir: str) -> None:
    """The engine process: the endpoint and the fronts first (they answer ``/healthz``, and 503
    "not ready" elsewhere), the URL said once a front is up, then the load (:func:`_bring_up`);
    until a stop signal (or a failed load, raised here once the fronts are stopped)."""
    import multiprocessing as mp

    path, prom_dir = os.path.join(workdir, "engine.sock"), os.path.join(workdir, "metrics")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: int) -> None:
        if not stop.is_set():
            say_draining(sig, cfg, say)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    endpoint = EngineEndpoint(None, path, metrics)
    await endpoint.start()
    bring_up = loop.create_task(_bring_up(load, endpoint, stop))
    ctx = mp.get_context("spawn")
    fronts: list = []

    def spawn(name: str):
        p = ctx.Process(target=run_front, args=(cfg, path, sock, access_log), name=name)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = prom_dir  # inherited by the fronts only
        try:
            p.start()
        finally:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        return p

    try:
        for i in range(cfg.http_workers):
            fronts.append(spawn(f"trawmem-http-{i}"))
        say(f"trawmem serve: {cfg.http_workers} HTTP front processes "
            f"(pids {', '.join(str(p.pid) for p in fronts)}) over this engine process ({os.getpid()})")
        deaths: list[float] = []
        await _supervise(stop, endpoint, bring_up, lambda: _restart_dead(fronts, deaths, loop.time(), spawn,
                                                                         prom_dir, say),
                         lambda: announce(sock.getsockname()[1]))
    finally:
        started = [p for p in fronts if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()  # SIGTERM: uvicorn's graceful shutdown
        grace = cfg.timeout_s + 10.0
        await loop.run_in_executor(None, lambda: [p.join(grace) for p in started])
        for p in started:
            if p.is_alive():
                p.kill()
        try:  # a load still running is waited for (a thread cannot be stopped); a failed one raises
            service = await bring_up
        finally:
            await endpoint.close()
    if service is not None:
        await service.stop()
    say("trawmem serve: stopped")


def serve_with_fronts(cfg: ServeConfig, load, metrics, announce, access_log: bool = False,
                      sock: socket.socket | None = None, say: Say = log_line) -> None:
    """Listen, run the engine endpoint here and ``cfg.http_workers`` front processes (a dead one
    started again: :func:`_restart_dead`), then load: ``load()`` (on a thread) gives the
    :class:`~.service.SelectionService`; ``announce(port)`` once a front is up, before the load is
    done (:func:`_engine_main`). Until SIGINT / SIGTERM, then shut down in order: fronts first (they
    answer what they hold, the engine still serving them), then the engine's batcher drains."""
    workdir = tempfile.mkdtemp(prefix="trawmem-serve-")  # mode 0700
    os.mkdir(os.path.join(workdir, "metrics"))
    sock = listening_socket(sock or bound_socket(cfg.host, cfg.port))
    try:
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:  # pragma: no cover
            runner = asyncio.Runner()
        with runner:
            runner.run(_engine_main(cfg, load, metrics, announce, access_log, sock, say, workdir))
    finally:
        sock.close()
        shutil.rmtree(workdir, ignore_errors=True)
