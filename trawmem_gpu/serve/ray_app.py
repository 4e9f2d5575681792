"""``trawmem serve --ray``: the same app as a Ray Serve application, banks sharded over replicas.

Layout (one Ray Serve application named ``trawmem``):

* ``trawmem-shard-<i>`` for ``i < shards``: one deployment (one replica) per shard. Shard ``i``
  serves the banks whose id hashes to ``i`` (:func:`shard_of`: sha1 of the id, modulo the
  shard count, stable across processes and machines), loading only those from the collection,
  so a cluster holds more banks than one machine. With ``--max-resident-bytes`` each shard opens
  its banks lazily and lets its least recently used go past that budget (per shard,
  ``memory.resident``), as the single-process server does. Its selection method is a ``@serve.batch``
  method (max batch and wait from ``--max-batch`` / ``--max-wait-ms``) that runs the service's
  batch function (one encoder call, one engine call per (budget, hops)) on the shard's batch
  worker thread; appends run on its append threads as in the single-process server.
* ``trawmem-router``: the ingress, the very FastAPI app of :mod:`.app` over a
  :class:`RayBackend` that routes each request to its bank's shard by bank id (a batch request
  fans out to the shards of its banks), fans ``GET /v1/banks`` out to every shard and maps
  Ray's back-pressure (``max_queued_requests`` = ``--max-queue`` per shard) to 429 and the
  deadline to 504. Keys, validation, metrics and error bodies are the app's own.

Every shard reads and writes the one collection directory, which must therefore be on a
filesystem all nodes share (and one whose file locks work across them: the index is rewritten
under the collection's lock on every bank write, see ``store/collection.py``); each shard
writes only its own banks.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import asdict

from ray import serve

from ..aio import within
from ..select.params import QueryParams
from .batcher import DeadlineExceeded, Later, QueueFull
from ..notes import Say
from .config import ServeConfig, log_line
from .portable import joined, regrouped
from .remote import error_fields, error_from

log = logging.getLogger(__name__)
APP_NAME = "trawmem"


def _refused(e: BaseException) -> dict:
    """A package error a shard answers with, as plain data for the router (the ``--http-workers``
    socket's own encoding, :func:`.remote.error_fields`); any other exception is raised."""
    fields = error_fields(e)
    if fields[0] == "internal":
        raise e
    return {"error": "refused", "fields": list(fields)}


def _raise_refused(r: dict, where: str = "") -> None:
    """Raise the package error a shard's ``{"error": "refused"}`` answer carries; ``where`` (a batch
    item's ``requests[i]: ``) prefixes a bank error's message as the single-process app does."""
    if r.get("error") != "refused":
        return
    from ..errors import QuarantinedBank, UnknownBank

    e = error_from(tuple(r["fields"]))
    if where and isinstance(e, QuarantinedBank):
        e = QuarantinedBank(e.bank_id, e.cause, where)
    elif where and isinstance(e, UnknownBank):
        e = UnknownBank(e.bank_id, where)
    raise e


def shard_of(bank_id: str, shards: int) -> int:
    """The shard that owns ``bank_id`` (stable: sha1 of the id modulo the shard count)."""
    return int.from_bytes(hashlib.sha1(bank_id.encode("utf-8")).digest()[:8], "big") % shards


@serve.deployment
class BankShard:
    """One shard: a :class:`~trawmem_gpu.serve.service.SelectionService` over its slice of banks."""

    def __init__(self, cfg: dict, shard: int, shards: int):
        from .service import SelectionService, freeze_heap, warm_up

        self.cfg = ServeConfig(**cfg)
        self.shard, self.shards = shard, shards
        self.service = SelectionService(self.cfg, owns=lambda b: shard_of(b, shards) == shard)
        import sys

        sys.setswitchinterval(self.cfg.switch_interval_ms / 1e3)
        if self.cfg.warmup:
            warm_up(self.service)
        freeze_heap()
        self.service.ready = True
        sel = self._select_batch
        if hasattr(sel, "set_max_batch_size"):
            sel.set_max_batch_size(self.cfg.max_batch)
            sel.set_batch_wait_timeout_s(self.cfg.max_wait_ms / 1e3)

    def info(self) -> dict:
        s = self.service
        return {"dim": s.dim, "encoder_id": s.encoder_id, "defaults": s.defaults, "shard": self.shard}

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def _select_batch(self, items: list) -> list:
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(self.service.worker, self.service.process_batch, items)
        out = []
        for r in res:  # workspaces still being assembled on the service's pool
            if isinstance(r, Later):
                try:
                    r = (await asyncio.wrap_future(r.future))[r.index]
                except Exception as e:  # noqa: BLE001 - fails only this chunk's queries
                    r = e
            out.append(r)
        return out

    async def select(self, item) -> dict:
        """One query (batched with concurrent ones); ``{"error": ...}`` instead of raising."""
        if not self.service.has_bank(item.bank_id):
            return _refused(self.service.registry.absent(item.bank_id))  # unknown, or quarantined
        from .service import open_cold

        item.arrived = time.perf_counter()  # this process's clock
        await open_cold(self.service, [item])  # a cold bank opens on the loader thread, not in a batch
        res = await self._select_batch(item)
        if isinstance(res, BaseException):
            if error_fields(res)[0] != "internal":  # a quarantined bank, bad input: the app's answer
                return _refused(res)
            log.error("selection failed: %s: %s", type(res).__name__, res)
            return {"error": "internal"}
        return res

    async def append(self, bank_id: str, records: list[dict]) -> dict:
        try:
            return await self.service.append(bank_id, records)
        except Exception as e:  # noqa: BLE001 - package errors go back as data, others are raised
            return _refused(e)

    async def forget(self, bank_id: str, turn_ids: list[str] | None, where=None) -> dict:
        try:
            return await self.service.forget(bank_id, turn_ids, where)
        except Exception as e:  # noqa: BLE001 - package errors go back as data, others are raised
            return _refused(e)

    def has_bank(self, bank_id: str) -> bool:
        return self.service.has_bank(bank_id)

    def resident(self) -> dict:
        """This shard's banks in memory: how many, their bytes, opens and evictions since start."""
        r = self.service.core.resident
        return {"banks": len(r), "bytes": r.total, "opened": r.opened, "evicted": r.evicted,
                "budget": r.max_bytes, "lazy": self.service.registry.lazy}

    def bank_list(self) -> list[dict]:
        return self.service.bank_list()

    def bank_info(self, bank_id: str, where=None) -> dict | None:
        try:
            return self.service.bank_info(bank_id, where)
        except Exception as e:  # noqa: BLE001 - package errors go back as data, others are raised
            return _refused(e)

    def history(self, bank_id: str, unit_id: str, where=None):
        try:
            return self.service.history(bank_id, unit_id, where)
        except Exception as e:  # noqa: BLE001 - package errors go back as data, others are raised
            return _refused(e)

    async def export_bank(self, bank_id: str, where=None, vectors: bool = False):
        """The export as a stream (called through ``handle.options(stream=True)``): first None, or
        the refusal (``_refused``: an unknown bank) and nothing else; then the pieces, joined to
        about ``remote.STREAM_BYTES`` each, made as the ingress reads them."""
        from .remote import STREAM_BYTES

        try:
            pieces = await self.service.export_bank(bank_id, where, vectors)
        except Exception as e:  # noqa: BLE001 - package errors go back as data, others are raised
            yield _refused(e)
            return
        yield None
        async for p in regrouped(pieces, STREAM_BYTES):
            yield p

    async def import_bank(self, bank_id: str, body: bytes, where=None) -> dict:
        try:
            return await self.service.import_bank(bank_id, body, where)
        except Exception as e:  # noqa: BLE001 - package errors go back as data, others are raised
            return _refused(e)


class RayBackend:
    """The app's :class:`~.backend.Backend` in the Ray router: each call goes to the shard of its bank."""

    def __init__(self, cfg: ServeConfig, shards: int, app_name: str = APP_NAME):
        self.cfg, self.n, self.app_name = cfg, shards, app_name
        self.handles: list = []
        self.ready = False
        self.dim, self.encoder_id, self.defaults = 0, None, QueryParams()

    async def start(self) -> None:
        self.handles = [serve.get_deployment_handle(f"trawmem-shard-{i}", app_name=self.app_name)
                        for i in range(self.n)]
        info = await self.handles[0].info.remote()
        self.dim, self.encoder_id, self.defaults = info["dim"], info["encoder_id"], info["defaults"]
        self.ready = True

    async def stop(self) -> None:
        self.ready = False

    def queue_depth(self) -> int:
        return 0  # queues live in the shards (Ray Serve's own metrics report them)

    def _h(self, bank_id: str):
        return self.handles[shard_of(bank_id, self.n)]

    async def select(self, items: list, batch: bool = False, quota=None) -> list[dict]:
        """(Per-key quotas are not applied across Ray shards; Ray Serve's back pressure bounds the queues.)"""
        from ray.serve.exceptions import BackPressureError

        calls = [self._h(it.bank_id).select.remote(it) for it in items]
        try:
            res = await within(asyncio.gather(*calls), self.cfg.timeout_s)
        except asyncio.TimeoutError:
            for c in calls:
                c.cancel()
            raise DeadlineExceeded(f"no answer within the {self.cfg.timeout_s:g} s deadline") from None
        except BackPressureError:
            for c in calls:
                c.cancel()
            raise QueueFull(1) from None
        for i, (it, r) in enumerate(zip(items, res)):
            _raise_refused(r, f"requests[{i}]: " if batch else "")
            if r.get("error"):
                raise RuntimeError(f"shard {shard_of(it.bank_id, self.n)} failed")
        return res

    async def append(self, bank_id: str, batch, quota=None) -> dict:
        r = await self._h(bank_id).append.remote(bank_id, batch)
        _raise_refused(r)
        return r

    async def forget(self, bank_id: str, turn_ids: list[str] | None, where=None) -> dict:
        r = await self._h(bank_id).forget.remote(bank_id, turn_ids, where)
        _raise_refused(r)
        return r

    async def has_bank(self, bank_id: str) -> bool:
        return await self._h(bank_id).has_bank.remote(bank_id)

    async def bank_list(self) -> list[dict]:
        parts = await asyncio.gather(*(h.bank_list.remote() for h in self.handles))
        return [b for p in parts for b in p]

    async def bank_info(self, bank_id: str, where=None) -> dict | None:
        r = await self._h(bank_id).bank_info.remote(bank_id, where)
        if r is not None:
            _raise_refused(r)
        return r

    async def history(self, bank_id: str, unit_id: str, where=None) -> list[dict] | None:
        r = await self._h(bank_id).history.remote(bank_id, unit_id, where)
        if isinstance(r, dict):
            _raise_refused(r)
        return r

    async def export_bank(self, bank_id: str, where=None, vectors: bool = False):
        """The shard's export streamed (a refusal raised before the first piece); the shard's side
        is cancelled when the reader stops early."""
        gen = self._h(bank_id).options(stream=True).export_bank.remote(bank_id, where, vectors)
        first = await gen.__anext__()
        if first is not None:
            _raise_refused(first)
        return _streamed(gen)

    async def import_bank(self, bank_id: str, body: bytes, where=None, quota=None) -> dict:
        r = await self._h(bank_id).import_bank.remote(bank_id, await joined(body), where)
        _raise_refused(r)
        return r

    async def metrics_text(self) -> bytes:
        return b""  # each replica's families are Ray Serve's own metrics


async def _streamed(gen):
    """The pieces of a shard's streamed answer (a Ray Serve response generator); cancelled when
    the reader stops before its end."""
    done = False
    try:
        async for piece in gen:
            yield piece
        done = True
    finally:
        if not done:
            gen.cancel()


def _router_builder(cfg: dict, shards: int, app_name: str):
    def build():
        from .app import create_app
        from .keys import KeyStore

        c = ServeConfig(**cfg)
        keys = KeyStore.load(c.keys_file) if c.keys_file else None
        return create_app(RayBackend(c, shards, app_name), c, keys)

    return build


def build_ray_app(cfg: ServeConfig, shards: int = 2, app_name: str = APP_NAME, shard_cpus: float = 1.0):
    """The Ray Serve application (bind it with ``serve.run(app, name=app_name)``)."""
    if shards < 1:
        raise ValueError(f"`shards` must be >= 1, got {shards}")
    d = asdict(cfg)
    shard_apps = [BankShard.options(name=f"trawmem-shard-{i}", num_replicas=1, max_queued_requests=cfg.max_queue,
                                    max_ongoing_requests=max(2 * cfg.max_batch, 100),
                                    ray_actor_options={"num_cpus": shard_cpus}).bind(d, i, shards)
                  for i in range(shards)]
    router = serve.deployment(serve.ingress(_router_builder(d, shards, app_name))())
    # The router only parses, checks and forwards (I/O-bound): it reserves no CPU of its own.
    return router.options(name="trawmem-router", max_ongoing_requests=max(4 * cfg.max_batch, 1000),
                          ray_actor_options={"num_cpus": 0}).bind(*shard_apps)


PATIENT_CONTROLLER_ENV = {
    # Ray Serve's controller gives a starting proxy 5 s to report ready and a running one 10 s
    # per health check (three misses kill it: ActorDiedError ... ProxyActor): sized for an idle
    # machine. A loaded one (2 busy cores, a first torch import) needs longer; a dead proxy
    # is still found, within these bounds.
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120",
}


def start_app(cfg: ServeConfig, shards: int = 2, shard_cpus: float = 1.0, wait_s: float = 900.0) -> None:
    """Start Ray Serve (HTTP on ``cfg.host:cfg.port``) and run the application until it serves.

    ``serve.start`` and ``serve.run`` each wait a fixed 60 s for the HTTP proxies, however
    loaded the machine is; a proxy that is slow to come up is restarted by the controller, so
    both are retried (same application: a no-op redeploy) until ``wait_s`` has passed."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        try:
            serve.start(http_options={"host": cfg.host, "port": cfg.port},
                        controller_options={"runtime_env": {"env_vars": PATIENT_CONTROLLER_ENV}})
            serve.run(build_ray_app(cfg, shards, shard_cpus=shard_cpus), name=APP_NAME, route_prefix="/")
            return
        except (TimeoutError, ray.exceptions.RayActorError) as e:
            if time.monotonic() > deadline:
                raise
            log.warning("Ray Serve is not serving yet (%s: %s); waiting on", type(e).__name__, e)


def serve_ray(cfg: ServeConfig, shards: int = 2, address: str | None = None, shard_cpus: float = 1.0,
              say: Say = log_line) -> None:
    """``trawmem serve --ray``: start (or join) Ray, run the application, serve until Ctrl-C;
    ``say`` takes the status line (the command prints it)."""
    import signal

    import ray

    def _stop(*_):
        raise KeyboardInterrupt

    ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
    signal.signal(signal.SIGTERM, _stop)  # after ray.init (it installs its own): shut down like Ctrl-C
    try:
        start_app(cfg, shards, shard_cpus)
        auth = f"API keys from {cfg.keys_file}" if cfg.keys_file else "no keys file: WITHOUT authentication"
        say(f"trawmem serve --ray: {shards} shards over {cfg.collection}, http://{cfg.host}:{cfg.port}; {auth}")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
