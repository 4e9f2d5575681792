"""A server that listens while it loads: :class:`Loading`, the ASGI app that answers until the
real app is ready (the one-process ``trawmem serve``: ``server._serve_loading``; each front of
``--http-workers``: :func:`loading_front`)."""
from __future__ import annotations

import asyncio
import json

LOADING = "loading the collection and the query encoder"
"""What a server that is not ready yet says it is doing (``/readyz`` and every route: 503)."""


class Loading:
    """The ASGI app of a server that listens while it loads (``server._serve_loading``, and each
    front of ``--http-workers``: :func:`loading_front`): ``/healthz`` answers 200, ``/readyz`` 503
    with what is loading, every other route 503 with ``Retry-After``, until :attr:`app` is set
    (the real app, started); then every request goes to it. ``startup`` (a coroutine function),
    when set, runs at the lifespan's startup, before the server accepts. Its lifespan stops the
    real app's at shutdown (``backend.stop``: the drain)."""

    def __init__(self, startup=None, refresh=None):
        self.app = None
        self.lifespan = None
        self.startup = startup
        self.refresh = refresh
        """When set, a coroutine function run before a request would be answered 503: it may set
        :attr:`app` (a front asks the engine's state afresh: :func:`loading_front`)."""
        self.reason = LOADING

    async def _lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    if self.startup is not None:
                        await self.startup()
                except Exception as e:  # noqa: BLE001 - uvicorn reports it and exits
                    await send({"type": "lifespan.startup.failed", "message": f"{type(e).__name__}: {e}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self.lifespan is not None:
                    await self.lifespan.__aexit__(None, None, None)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if self.app is not None:
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            return
        ok = scope.get("path") == "/healthz"
        if not ok and self.refresh is not None:
            await self.refresh()
            if self.app is not None:
                return await self.app(scope, receive, send)
        body = json.dumps({"status": "ok"} if ok else {"detail": f"not ready: {self.reason}"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if not ok and scope.get("path") != "/readyz":
            headers.append((b"retry-after", b"1"))
        await send({"type": "http.response.start", "status": 200 if ok else 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def loading_front(app, backend) -> Loading:
    """A front process's ASGI app (``--http-workers``: ``remote.run_front``): :class:`Loading`
    until the engine process says it is ready for the first time, then ``app``. At startup (before
    the front accepts) ``app``'s lifespan connects ``backend`` (a ``RemoteBackend``) to the engine
    and asks its state: a front started beside a ready engine serves ``app`` from its first request;
    one started while the engine loads answers 503 with the engine's own reason (``/healthz``
    200) and switches once ``backend.ready`` (the engine's state, polled, and asked afresh before
    each 503: fronts poll apart, and a request after another front's ``/readyz`` 200 must not
    meet this one's stale state)."""
    front, waiting = Loading(), []

    async def refresh():
        if front.lifespan is not None and await backend.refresh():
            front.app = app
        else:
            front.reason = getattr(backend, "loading", None) or LOADING

    front.refresh = refresh

    async def until_ready():
        while not backend.ready:
            front.reason = getattr(backend, "loading", None) or LOADING
            await asyncio.sleep(0.05)
        front.app = app

    async def startup():
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()  # backend.start: connected, the engine's first state read
        front.lifespan = lifespan
        if backend.ready:
            front.app = app
        else:
            waiting.append(asyncio.get_running_loop().create_task(until_ready()))  # held: not collected

    front.startup = startup
    return front
