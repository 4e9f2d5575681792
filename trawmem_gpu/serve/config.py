"""Serving options: every knob of ``trawmem serve`` in one dataclass, one docstring per field."""
from __future__ import annotations

import logging
import signal

from dataclasses import dataclass

from ..errors import ConfigError
from ..notes import Say  # where a server's status lines go (start, drain, stop): `trawmem serve`
from ..select.params import SERVED_LIMITS, QueryLimits  # prints them; code that starts one logs them

log = logging.getLogger(__name__)


def log_line(line: str) -> None:
    """The default :data:`Say`: the line as an INFO record of this module's logger."""
    log.info("%s", line)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeConfig:
    """How the selection service runs (``trawmem serve --help`` names each as a flag)."""

    collection: str = "trawmem-serve"
    """Collection directory served (``--collection``); created empty when it does not exist."""
    host: str = "127.0.0.1"
    """Bind address (``--host``); anything but 127.0.0.1 needs a keys file."""
    port: int = 8000
    """TCP port (``--port``; 0 picks a free one)."""
    keys_file: str | None = None
    """JSON file of sha256(API key) -> tenant (``--keys``); without it there is no authentication
    and the server binds to 127.0.0.1 only."""
    max_batch: int = 64
    """Most queries coalesced into one encoder call and one engine call (``--max-batch``)."""
    max_wait_ms: float = 5.0
    """Longest a query waits for others to join its batch when the engine is idle
    (``--max-wait-ms``); queries that queued while a batch was running never wait."""
    max_queue: int = 1024
    """Most queries waiting (``--max-queue``); beyond it the answer is 429 with Retry-After."""
    timeout_s: float = 10.0
    """Per-query deadline from arrival (``--timeout``); past it the answer is 504."""
    max_body_bytes: int = 4 << 20
    """Largest request body accepted (``--max-body-bytes``); larger gets 413."""
    limits: QueryLimits = SERVED_LIMITS
    """The bounds of a request's ``budget``, ``hops``, ``token_budget`` and question length
    (``--max-budget``, ``--max-hops``, ``--max-token-budget``; ``select.params.QueryLimits``, or
    its fields as a dict: ``dataclasses.asdict`` of a ``ServeConfig`` rebuilds)."""
    encode_chunk: int = 16
    """Questions per encoder forward pass within a batch (the batch is length-sorted, then cut;
    ``--encode-chunk``). On a CPU the default is the size that cost least CPU per question for
    MiniLM on one thread, among one at a time and chunks of 8-64 (``benchmarks/bench_serve.py``
    measures each; docs/design-notes.md). On a GPU take the whole batch."""
    max_batch_request: int = 256
    """Most requests in one ``POST /v1/select/batch``."""
    max_turns_per_append: int = 1000
    """Most turns in one ``POST /v1/banks/{bank_id}/turns``."""
    tenant_max_queued: int = 512
    """Most queries one API key may have waiting for a batch (``--tenant-max-queued``); beyond it
    that key gets 429 with Retry-After while other keys are still admitted. A keys-file entry's
    ``limits.max_queued`` overrides it for that key. At least ``max_batch_request``, or a full
    batch call could never be admitted."""
    tenant_batch_share: int = 4
    """Most of one API key's queries in one engine batch (``--tenant-batch-share``; the keys
    file's ``limits.batch_share`` overrides it). Another key's query waits behind at most the
    engine call already running, so this bounds that call's length: a key's 256-query batch runs
    as 64 engine calls of 4, and a lone query of another key joins the next one (the default's
    measurement against 16: benchmarks/results/serve_hostile.md). Without a keys file
    there is one tenant and no share: its batches fill to ``max_batch``."""
    tenant_max_appends: int = 4
    """Most appends one API key may have in flight at once (``--tenant-max-appends``); beyond it
    429 with Retry-After. A keys-file entry's ``limits.max_appends`` overrides it for that key."""
    append_chunk: int = 16
    """Turns an append encodes per encoder call (``--append-chunk``): between chunks the append
    waits while a query batch is being encoded or selected, so a large append yields the CPU to
    queries instead of holding it for its whole encode."""
    max_connections: int = 1024
    """Most open HTTP connections per process (``--max-connections``; per front with
    ``--http-workers``); a connection beyond it is closed at once. Connections already open are
    never refused, so a flood of idle or slow connections cannot turn away a client's next
    request on its open connection."""
    header_timeout_s: float = 10.0
    """Seconds a connection may take from opening (or from a request's first byte) to the end of
    that request's headers (``--header-timeout``); then it gets 408 and is closed (slow-header
    and idle-before-first-request connections)."""
    body_timeout_s: float = 10.0
    """Seconds a request may take to deliver its whole body once its headers are in
    (``--body-timeout``); then 408."""
    keep_alive_s: float = 5.0
    """Seconds an idle keep-alive connection stays open between requests (``--keep-alive``)."""
    encoder: str | None = None
    """Query encoder spec; None = the collection's build config encoder (``minilm`` if empty)."""
    llm: str | None = None
    """LLM spec (``--llm``: ``http(s)://HOST:PORT/v1[@MODEL]`` or ``vllm:MODEL_PATH``) for appends to
    and forgets from banks built with LLM segmentation or heads; its work (calls, retries, tokens,
    seconds, malformed / refused / fallen-back outputs) is counted in ``/metrics``. None: such
    appends fall back as forgets do (or are refused where the bank needs an LLM)."""
    threads: int | None = None
    """torch / engine worker threads (``--threads``); None: :func:`default_threads` (half the
    host's usable cores, less one per HTTP front process, at least 1)."""
    switch_interval_ms: float = 0.5
    """Python's GIL switch interval in this process (``sys.setswitchinterval``; Python's default is
    5 ms). The encoder and engine release the GIL around every native call, so while another thread
    runs Python code (HTTP handling, an append's rebuild) each re-acquisition can wait a full
    interval; a short one bounds that wait."""
    warmup: bool = True
    """Run one selection at start (numba compilation, encoder warm-up) before /readyz says ready."""
    http_workers: int = 0
    """``--http-workers``: 0 serves HTTP in the engine's own process; N > 0 runs HTTP (keys,
    validation, routes, JSON) in N front processes that forward to one engine process over a
    private Unix socket (:mod:`.remote`), so HTTP does not share the engine's GIL."""

    max_resident_bytes: int | None = None
    """``--max-resident-bytes``: open banks lazily (on their first request) and let the least
    recently used go once the banks held, with their engine tables, pass this many bytes
    (``memory.resident``); a cold bank's first query opens it on a loader thread, off the batch
    worker. None: every bank is loaded at start and stays. With ``--ray``, per shard."""

    upstream: str | None = None
    """``--upstream``: the OpenAI-compatible base URL (``http://HOST:PORT/v1``) of an inference
    server (vLLM, llama.cpp, ...) that ``POST /v1/chat/completions`` forwards to with a workspace
    placed in its messages (:mod:`.proxy`); None: no such route."""
    upstream_key_env: str = "TRAWMEM_UPSTREAM_API_KEY"
    """``--upstream-key-env``: the environment variable holding the upstream's own API key (sent
    as its bearer token; unset or empty: none). The caller's key is this server's, never forwarded."""
    upstream_timeout_s: float = 120.0
    """``--upstream-timeout``: seconds to connect to the upstream and between its bytes (then 504)."""
    proxy_token_budget: int = 1024
    """``--proxy-token-budget``: the workspace's token budget of a proxied request whose key and
    request name none (a keys-file entry's ``token_budget`` overrides it for that key); checked
    against ``max_token_budget`` only with an ``upstream`` (without one it is never read)."""

    units: tuple = ("turns",)
    """The layers the engine selects from (``--units``: ``facts.view.unit_view`` of every bank)."""
    method: str = "trawmem"
    """``--method``: ``trawmem``, or ``trimem`` (TriMem's retrieval over the banks' facts, the question
    the only search: ``trimem.method.TriMemEngine``; ``units`` stays ``turns``)."""

    def __post_init__(self):
        from ..store.view import DEFAULT_UNITS, parse_units

        self.units = parse_units(self.units)
        if self.method not in ("trawmem", "trimem"):
            raise ConfigError(f"`method` must be trawmem or trimem, got {self.method!r}")
        if self.method == "trimem" and self.units != DEFAULT_UNITS:
            raise ConfigError("`units`: method trimem shows its own units (facts, their turns, profiles)")
        for name in ("max_batch", "encode_chunk", "max_queue", "max_body_bytes", "max_batch_request", "max_turns_per_append", "tenant_max_queued",
                     "tenant_max_appends", "tenant_batch_share", "append_chunk", "max_connections"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`{name}` must be >= 1, got {getattr(self, name)!r}")
        if isinstance(self.limits, dict):
            self.limits = QueryLimits(**self.limits)
        if not isinstance(self.limits, QueryLimits):
            raise ConfigError(f"`limits` must be a QueryLimits, got {type(self.limits).__name__}")
        if self.max_wait_ms < 0:
            raise ConfigError(f"`max_wait_ms` must be >= 0, got {self.max_wait_ms!r}")
        if self.switch_interval_ms <= 0:
            raise ConfigError(f"`switch_interval_ms` must be > 0, got {self.switch_interval_ms!r}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "upstream_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"`{name}` must be > 0 seconds, got {getattr(self, name)!r}")
        if self.timeout_s <= 0:
            raise ConfigError(f"`timeout_s` must be > 0 seconds, got {self.timeout_s!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"`port` must lie in 0..65535, got {self.port!r}")
        if self.upstream is not None and not self.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"`upstream` must be an http(s):// base URL (e.g. http://127.0.0.1:8080/v1), "
                              f"got {self.upstream!r}")
        if not 1 <= self.proxy_token_budget <= (self.limits.max_token_budget if self.upstream else 10 ** 9):
            raise ConfigError(f"`proxy_token_budget` must lie in 1..{self.limits.max_token_budget} (the "
                              f"`max_token_budget`), got {self.proxy_token_budget!r}")
        if self.http_workers < 0:
            raise ConfigError(f"`http_workers` must be >= 0, got {self.http_workers!r}")
        if self.max_resident_bytes is not None and self.max_resident_bytes < 0:
            raise ConfigError(f"`max_resident_bytes` must be >= 0, got {self.max_resident_bytes!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"`threads` must be >= 1, got {self.threads!r}")
        if self.keys_file is None and self.host not in LOCAL_HOSTS:
            raise ConfigError(f"`host` {self.host} without `keys_file`: a server without API keys binds to "
                              "127.0.0.1 only; set `keys_file` to serve other hosts")


def bound_socket(host: str, port: int) -> "socket.socket":
    """A TCP socket bound to ``host:port`` (``port`` 0: a free one), not yet listening: bound before
    the server loads anything or says its URL, so a busy port is one line (exit 2), at once.

    :raises ConfigError: the address is in use or cannot be bound
    """
    import errno
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"`port` {port}: {host}:{port} is already in use (pick another `port`, or 0 for a "
                              "free one)") from None
        raise ConfigError(f"`host` {host} `port` {port}: cannot listen there ({e.strerror or e})") from None
    return sock


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(http_workers: int = 0, cores: int | None = None) -> int:
    """torch / engine threads when ``--threads`` is not given: ``max(1, cores // 2 - http_workers)``.

    The engine process runs more than the encoder and engine: the event loop (HTTP, in one
    process), workspace assembly (2 threads) and appends share its cores, and each HTTP front
    process takes a core of its own; torch's default (every core) oversubscribes them.
    Half the cores leaves the other half to those."""
    cores = usable_cores() if cores is None else cores
    return max(1, cores // 2 - int(http_workers))


def uvicorn_config(app, cfg: ServeConfig, access_log: bool = False, graceful_s: float | None = None):
    """uvicorn's settings for serving ``app`` as ``cfg`` says (the one-process server and each
    HTTP front of :mod:`.remote` alike): the connection limits of :mod:`.conn` (connection cap,
    header timeout) and the keep-alive bound."""
    import uvicorn

    from .conn import bounded_protocol

    return uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="info" if access_log else "warning",
                          access_log=access_log, timeout_graceful_shutdown=graceful_s or (cfg.timeout_s + 5),
                          lifespan="on", server_header=False, limit_concurrency=None,
                          timeout_keep_alive=cfg.keep_alive_s, http=bounded_protocol(cfg))


def say_draining(sig: int, cfg: "ServeConfig", say: Say = log_line) -> None:
    """The line a stop signal gets (SIGTERM or Ctrl-C): what the server does before it exits."""
    say(f"trawmem serve: {signal.Signals(sig).name}: draining: no new connections; requests in flight and queued "
        f"are answered (each within --timeout {cfg.timeout_s:g} s), then it stops")
