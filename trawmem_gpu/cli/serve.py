"""``trawmem serve``: the HTTP selection service (:mod:`trawmem_gpu.serve`)."""
from __future__ import annotations

from ..errors import ConfigError


def _need_extra(extra: str, modules: tuple[str, ...]) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"`trawmem serve` needs {', '.join(missing)}: pip install 'trawmem_gpu[{extra}]'")


def _sample_into(collection: str) -> None:
    """Build the bundled sample conversation into ``collection`` unless it already holds it."""
    from ..ingest import build_banks
    from ..data import load_conversations, sample_path
    from ..store import Collection

    coll = Collection(collection, create=True)
    convs = [c for c in load_conversations(sample_path()) if c.bank_id not in coll]
    if convs:
        banks, _ = build_banks(convs, progress=False)
        for b in banks:
            coll.put(b)
        print(f"trawmem serve: built the bundled sample into {collection} (bank ids: "
              f"{', '.join(b.bank_id for b in banks)})", flush=True)


def cmd_serve(a) -> int:
    from ..serve.config import ServeConfig

    _need_extra("serve", ("fastapi", "uvicorn", "prometheus_client"))
    from ..select.params import QueryLimits

    vals = {field: getattr(a, flag.lstrip("-").replace("-", "_")) for flag, field, *_ in _config_flags()}
    limits = QueryLimits(**{k.split(".")[1]: vals.pop(k) for k in list(vals) if k.startswith("limits.")})
    cfg = ServeConfig(**vals, limits=limits, units=a.units, method=a.method)
    if a.sample:
        _sample_into(cfg.collection)
    if a.ray:
        if a.http_workers:
            raise ConfigError("--http-workers is for one machine; with --ray the router and shards are Ray's processes")
        _need_extra("ray", ("ray",))
        from ..serve.ray_app import serve_ray

        serve_ray(cfg, shards=a.shards, address=a.ray_address, shard_cpus=a.shard_cpus, say=_say)
        return 0
    from ..serve.server import serve_forever

    serve_forever(cfg, access_log=a.access_log, say=_say)
    return 0


def _say(line: str) -> None:
    """A server's status line, on stdout as it happens."""
    print(line, flush=True)


def _config_flags() -> list[tuple]:
    """(flag, ``ServeConfig`` field, type, help) of every ``trawmem serve`` flag that sets one
    field (the field's default is the flag's; ``limits.NAME``: a field of ``ServeConfig.limits``):
    one list for both the parser and ``cmd_serve``."""
    from .args import budget_int, hops_int, nonneg_float, nonneg_int, port_int, positive_float, positive_int, \
        token_budget_int

    return [
        ("--collection", "collection", str, "collection directory (created when missing)"),
        ("--host", "host", str, "bind address; other than 127.0.0.1 needs --keys"),
        ("--port", "port", port_int, "TCP port (0: a free one)"),
        ("--keys", "keys_file", str, "keys file (sha256 of API keys -> tenants); see `trawmem serve-key` (default: "
                                     "none, no authentication and 127.0.0.1 only)"),
        ("--max-batch", "max_batch", positive_int, "most queries per engine batch"),
        ("--max-wait-ms", "max_wait_ms", nonneg_float, "longest a query waits for a batch to fill when the engine is idle"),
        ("--max-queue", "max_queue", positive_int, "queued queries before 429"),
        ("--encode-chunk", "encode_chunk", positive_int,
         "questions per encoder forward pass within a batch (16 suits a CPU; raise it on a GPU)"),
        ("--timeout", "timeout_s", positive_float, "per-query deadline in seconds (then 504)"),
        ("--max-body-bytes", "max_body_bytes", positive_int, "largest request body (then 413)"),
        ("--max-budget", "limits.max_budget", budget_int, "largest per-request budget"),
        ("--max-hops", "limits.max_hops", hops_int, "largest per-request hops"),
        ("--max-token-budget", "limits.max_token_budget", token_budget_int, "largest per-request token_budget"),
        ("--encoder", "encoder", str, "query encoder (default: the collection's)"),
        ("--llm", "llm", str, "LLM for appends to banks built with LLM segmentation or heads: "
                              "http(s)://HOST:PORT/v1[@MODEL] | vllm:MODEL_PATH (its work is counted in /metrics) "
                              "(default: none: an append to such a bank is refused, naming the missing LLM)"),
        ("--threads", "threads", positive_int,
         "torch and engine threads (default: half the usable cores less one per HTTP front, at least 1)"),
        ("--tenant-max-queued", "tenant_max_queued", positive_int,
         "queries one API key may have waiting before 429 (the keys file's limits.max_queued overrides)"),
        ("--tenant-max-appends", "tenant_max_appends", positive_int,
         "appends one API key may have in flight before 429 (limits.max_appends overrides)"),
        ("--tenant-batch-share", "tenant_batch_share", positive_int,
         "most of one API key's queries in one engine batch (limits.batch_share overrides)"),
        ("--append-chunk", "append_chunk", positive_int,
         "turns an append encodes per call, giving way to query batches between calls"),
        ("--max-connections", "max_connections", positive_int,
         "open HTTP connections per process; a new one beyond it is closed at once"),
        ("--header-timeout", "header_timeout_s", positive_float, "seconds to finish a request's headers (then 408 and close)"),
        ("--body-timeout", "body_timeout_s", positive_float, "seconds to deliver a request's body (then 408)"),
        ("--keep-alive", "keep_alive_s", positive_float, "seconds an idle keep-alive connection stays open"),
        ("--switch-interval-ms", "switch_interval_ms", positive_float,
         "Python GIL switch interval (short keeps HTTP and the engine responsive to each other)"),
        ("--http-workers", "http_workers", nonneg_int,
         "HTTP front processes in front of this engine process (0: HTTP in this process); "
         "each takes HTTP, keys and JSON off the engine's GIL"),
        ("--upstream", "upstream", str, "OpenAI-compatible base URL of an inference server (http://HOST:PORT/v1): "
                                        "POST /v1/chat/completions then forwards to it with a workspace placed in the "
                                        "messages (default: none, no such route)"),
        ("--upstream-key-env", "upstream_key_env", str, "environment variable holding the upstream's API key"),
        ("--upstream-timeout", "upstream_timeout_s", positive_float,
         "seconds to connect to the upstream and between its bytes (then 504)"),
        ("--proxy-token-budget", "proxy_token_budget", token_budget_int,
         "the proxy's workspace token budget when neither the key nor the request names one"),
        ("--max-resident-bytes", "max_resident_bytes", nonneg_int,
         "open banks on first use and let the least recently used go past this many bytes of banks and "
         "their tables (default: none, every bank loaded at start; with --ray: per shard)"),
    ]


def configure(s) -> None:
    from .args import positive_float, positive_int
    from ..serve.config import ServeConfig

    d = ServeConfig()
    s.describe("Serve workspace selection over HTTP (API v1, OpenAPI at /docs): dynamic batching, API keys "
               "per tenant, live appends and Prometheus metrics. Needs the serve extra.")
    from operator import attrgetter

    for flag, field, kind, text in _config_flags():
        s.add_argument(flag, type=kind, default=attrgetter(field)(d), help=text)
    s.add_argument("--sample", action="store_true", help="first build the bundled sample conversation into it")
    from .args import add_units

    add_units(s)
    s.add_argument("--method", choices=["trawmem", "trimem"], default=d.method,
                   help="selection method: TrawMem, or TriMem's retrieval over the banks' facts, their source turns "
                        "and profiles (banks built with --facts; the question is the only search)")
    s.add_argument("--access-log", action="store_true", help="log every request line")
    s.add_argument("--ray", action="store_true", help="run as a Ray Serve application (extra: ray)")
    s.add_argument("--shards", type=positive_int, default=2, help="--ray: bank shards (one replica each)")
    s.add_argument("--shard-cpus", type=positive_float, default=1.0, help="--ray: CPUs each shard reserves")
    s.add_argument("--ray-address", help="--ray: address of a running Ray cluster (default: start a local one)")
    s.set_defaults(fn=cmd_serve)
