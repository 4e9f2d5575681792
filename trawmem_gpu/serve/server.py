"""Running the app under uvicorn: in the foreground (``trawmem serve``) or on a background
thread on an ephemeral port (tests, benchmarks, embedding in another program)."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading

from ..errors import plural
from ..notes import Say
from .config import ServeConfig, bound_socket, log_line, say_draining, uvicorn_config
from .loading import Loading

log = logging.getLogger(__name__)


def build_app(cfg: ServeConfig, **service_kw):
    """(app, service) for ``cfg``: keys loaded, banks loaded, nothing started yet."""
    from .app import create_app
    from .backend import LocalBackend
    from .keys import KeyStore
    from .metrics import Metrics
    from .service import SelectionService

    keys = KeyStore.load(cfg.keys_file) if cfg.keys_file else None
    metrics = Metrics()
    service = SelectionService(cfg, metrics=metrics, **service_kw)
    return create_app(LocalBackend(service), cfg, keys, metrics), service


class BackgroundServer:
    """The real server on ``127.0.0.1`` and a free port, on a daemon thread.

    ``with BackgroundServer(app) as s: httpx.get(s.url + "/healthz")``; leaving the block shuts
    it down gracefully (in-flight requests are answered, the batcher drains).
    """

    def __init__(self, app, cfg: ServeConfig | None = None, start_timeout: float = 120.0):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, cfg or ServeConfig()))
        self.start_timeout = start_timeout
        self.thread = threading.Thread(target=self._run, name="trawmem-serve", daemon=True)
        self.error: BaseException | None = None

    def _run(self):
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as e:  # pragma: no cover - surfaced by start()
            self.error = e

    def start(self) -> "BackgroundServer":
        import time

        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if self.error is not None or not self.thread.is_alive():
                raise RuntimeError(f"server failed to start: {self.error!r}")
            if time.monotonic() - t0 > self.start_timeout:
                self.stop()
                raise TimeoutError(f"server not started within {self.start_timeout} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve_forever(cfg: ServeConfig, access_log: bool = False, say: Say = log_line, **service_kw) -> None:
    """``trawmem serve``: load, warm up, serve until SIGINT / SIGTERM, then drain. With
    ``cfg.http_workers`` > 0, HTTP runs in that many front processes (:mod:`.remote`). ``say``
    takes each status line (the command prints them)."""
    sock = bound_socket(cfg.host, cfg.port)  # first: a busy port is one line, before the long load
    try:
        _serve_on(sock, cfg, access_log, say, **service_kw)
    finally:
        sock.close()


def _serve_on(sock: socket.socket, cfg: ServeConfig, access_log: bool, say: Say, **service_kw) -> None:
    import uvicorn

    if not cfg.http_workers:
        _serve_loading(sock, cfg, access_log, say, **service_kw)
        return
    from .metrics import Metrics
    from .fronts import serve_with_fronts
    from .service import SelectionService

    metrics = Metrics("engine")

    def load():  # on a thread of the engine process, its fronts already answering (503 until ready)
        service = SelectionService(cfg, metrics=metrics, **service_kw)
        _say_loaded(service, cfg, say)
        return service

    serve_with_fronts(cfg, load, metrics, lambda port: _announce(cfg, port, say), access_log, sock=sock, say=say)


def _announce(cfg: ServeConfig, port: int, say: Say) -> None:
    say(f"trawmem serve: batching up to {cfg.max_batch} queries, waiting at most {cfg.max_wait_ms:g} ms; "
        f"queue {cfg.max_queue}; deadline {cfg.timeout_s:g} s; http://{cfg.host}:{port} (OpenAPI at /docs)")


def _say_loaded(service, cfg: ServeConfig, say: Say) -> None:
    banks = service.bank_list()
    auth = (f"API keys from {cfg.keys_file}" if cfg.keys_file else
            "no keys file: serving WITHOUT authentication, bound to 127.0.0.1 only")
    say(f"trawmem serve: {plural(len(banks), 'bank')}, {plural(sum(b['n_units'] for b in banks), 'unit')} from "
        f"{cfg.collection} (encoder {service.encoder_id}); {auth}")
    for bank_id, cause in sorted(service.registry.quarantined.items()):
        say(f"trawmem serve: bank {bank_id!r} is quarantined (not served; DELETE /v1/banks/{{bank_id}} or "
            f"`trawmem forget --bank` removes it): {cause}")
    if service.registry.created:
        say(f"trawmem serve: {cfg.collection} did not exist: created an empty collection there "
            "(banks come with POST /v1/banks/{bank_id}/turns)")


def _serve_loading(sock: socket.socket, cfg: ServeConfig, access_log: bool, say: Say, **service_kw) -> None:
    """One process: listen at once (:class:`Loading` answers), say the URL once it listens, then
    load the collection and the encoder and start the app (its warm-up), and serve it."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not self.should_exit:
                say_draining(sig, cfg, say)
            super().handle_exit(sig, frame)

    front = Loading()
    server = Server(uvicorn_config(front, cfg, access_log))

    async def main():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():
            return await task
        _announce(cfg, sock.getsockname()[1], say)
        try:
            app, service = await asyncio.get_running_loop().run_in_executor(None, lambda: build_app(cfg, **service_kw))
            _say_loaded(service, cfg, say)
            front.reason = "warming up"
            lifespan = app.router.lifespan_context(app)
            await lifespan.__aenter__()  # backend.start: the batcher, the warm-up
            front.lifespan, front.app = lifespan, app
        except BaseException:
            server.should_exit = True
            await task
            raise
        await task

    # uvicorn re-raises the signal it caught once its graceful shutdown is done; for SIGTERM
    # that is a finished drain, so the handler it finds does nothing and the process exits 0
    signal.signal(signal.SIGTERM, lambda *_: None)
    asyncio.run(main())
    say("trawmem serve: stopped")
