"""``trawmem serve`` (the HTTP selection service) and ``trawmem serve-key`` (API keys)."""
from __future__ import annotations

import sys

from ..errors import ConfigError


def _need_extra(extra: str, modules: tuple[str, ...]) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"`trawmem serve` needs {', '.join(missing)}: pip install 'trawmem_gpu[{extra}]'")


def _sample_into(collection: str) -> None:
    """Build the bundled sample conversation into ``collection`` unless it already holds it."""
    from ..construct import build_banks
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
    from .config import ServeConfig

    _need_extra("serve", ("fastapi", "uvicorn", "prometheus_client"))
    cfg = ServeConfig(collection=a.collection, host=a.host, port=a.port, keys_file=a.keys, max_batch=a.max_batch,
                      max_wait_ms=a.max_wait_ms, max_queue=a.max_queue, timeout_s=a.timeout,
                      max_body_bytes=a.max_body_bytes, max_budget=a.max_budget, max_hops=a.max_hops,
                      max_token_budget=a.max_token_budget,
                      encoder=a.encoder, threads=a.threads,
                      switch_interval_ms=a.switch_interval_ms, encode_chunk=a.encode_chunk,
                      http_workers=a.http_workers, tenant_max_queued=a.tenant_max_queued,
                      tenant_max_appends=a.tenant_max_appends, tenant_batch_share=a.tenant_batch_share,
                      append_chunk=a.append_chunk,
                      max_connections=a.max_connections, header_timeout_s=a.header_timeout,
                      body_timeout_s=a.body_timeout, keep_alive_s=a.keep_alive, units=a.units, method=a.method)
    if a.sample:
        _sample_into(cfg.collection)
    if a.ray:
        if a.http_workers:
            raise ConfigError("--http-workers is for one machine; with --ray the router and shards are Ray's processes")
        _need_extra("ray", ("ray",))
        from .ray_app import serve_ray

        serve_ray(cfg, shards=a.shards, address=a.ray_address, shard_cpus=a.shard_cpus)
        return 0
    from .server import serve_forever

    serve_forever(cfg, access_log=a.access_log)
    return 0


def cmd_serve_key(a) -> int:
    from .keys import add_key

    key = add_key(a.keys, a.tenant, a.banks, writable=not a.read_only)
    print(f"added a {'read-only' if a.read_only else 'read-write'} key for tenant {a.tenant!r} "
          f"(banks {', '.join(a.banks)}) to {a.keys}; it is shown once, only its sha256 is stored:", file=sys.stderr)
    print(key)
    return 0


def configure_serve(s) -> None:
    from ..cli_args import budget_int, hops_int, nonneg_float, nonneg_int, port_int, positive_float, positive_int, \
        token_budget_int
    from .config import ServeConfig

    d = ServeConfig()
    s.describe("Serve workspace selection over HTTP (API v1, OpenAPI at /docs): dynamic batching, API keys "
               "per tenant, live appends and Prometheus metrics. Needs the serve extra.")
    s.add_argument("--collection", default=d.collection, help="collection directory (created when missing)")
    s.add_argument("--sample", action="store_true", help="first build the bundled sample conversation into it")
    s.add_argument("--host", default=d.host, help="bind address; other than 127.0.0.1 needs --keys")
    s.add_argument("--port", type=port_int, default=d.port, help="TCP port (0: a free one)")
    s.add_argument("--keys", help="keys file (sha256 of API keys -> tenants); see `trawmem serve-key` (default: "
                                  "none, no authentication and 127.0.0.1 only)")
    s.add_argument("--max-batch", type=positive_int, default=d.max_batch, help="most queries per engine batch")
    s.add_argument("--max-wait-ms", type=nonneg_float, default=d.max_wait_ms,
                   help="longest a query waits for a batch to fill when the engine is idle")
    s.add_argument("--max-queue", type=positive_int, default=d.max_queue, help="queued queries before 429")
    s.add_argument("--encode-chunk", type=positive_int, default=d.encode_chunk,
                   help="questions per encoder forward pass within a batch (16 suits a CPU; raise it on a GPU)")
    s.add_argument("--timeout", type=positive_float, default=d.timeout_s,
                   help="per-query deadline in seconds (then 504)")
    s.add_argument("--max-body-bytes", type=positive_int, default=d.max_body_bytes,
                   help="largest request body (then 413)")
    s.add_argument("--max-budget", type=budget_int, default=d.max_budget, help="largest per-request budget")
    s.add_argument("--max-hops", type=hops_int, default=d.max_hops, help="largest per-request hops")
    s.add_argument("--max-token-budget", type=token_budget_int, default=d.max_token_budget,
                   help="largest per-request token_budget")
    s.add_argument("--encoder", help="query encoder (default: the collection's)")
    s.add_argument("--threads", type=positive_int,
                   help="torch and engine threads (default: half the usable cores less one per HTTP front, at least 1)")
    s.add_argument("--tenant-max-queued", type=positive_int, default=d.tenant_max_queued,
                   help="queries one API key may have waiting before 429 (the keys file's limits.max_queued overrides)")
    s.add_argument("--tenant-max-appends", type=positive_int, default=d.tenant_max_appends,
                   help="appends one API key may have in flight before 429 (limits.max_appends overrides)")
    s.add_argument("--tenant-batch-share", type=positive_int, default=d.tenant_batch_share,
                   help="most of one API key's queries in one engine batch (limits.batch_share overrides)")
    s.add_argument("--append-chunk", type=positive_int, default=d.append_chunk,
                   help="turns an append encodes per call, giving way to query batches between calls")
    s.add_argument("--max-connections", type=positive_int, default=d.max_connections,
                   help="open HTTP connections per process; a new one beyond it is closed at once")
    s.add_argument("--header-timeout", type=positive_float, default=d.header_timeout_s,
                   help="seconds to finish a request's headers (then 408 and close)")
    s.add_argument("--body-timeout", type=positive_float, default=d.body_timeout_s,
                   help="seconds to deliver a request's body (then 408)")
    s.add_argument("--keep-alive", type=positive_float, default=d.keep_alive_s,
                   help="seconds an idle keep-alive connection stays open")
    s.add_argument("--switch-interval-ms", type=positive_float, default=d.switch_interval_ms,
                   help="Python GIL switch interval (short keeps HTTP and the engine responsive to each other)")
    s.add_argument("--http-workers", type=nonneg_int, default=d.http_workers,
                   help="HTTP front processes in front of this engine process (0: HTTP in this process); "
                        "each takes HTTP, keys and JSON off the engine's GIL")
    from ..cli_args import add_units

    add_units(s)
    s.add_argument("--method", choices=["trawmem", "trimem"], default="trawmem",
                   help="selection method: TrawMem, or TriMem's retrieval over the banks' facts, their source turns "
                        "and profiles (banks built with --facts; the question is the only search)")
    s.add_argument("--access-log", action="store_true", help="log every request line")
    s.add_argument("--ray", action="store_true", help="run as a Ray Serve application (extra: ray)")
    s.add_argument("--shards", type=positive_int, default=2, help="--ray: bank shards (one replica each)")
    s.add_argument("--shard-cpus", type=positive_float, default=1.0, help="--ray: CPUs each shard reserves")
    s.add_argument("--ray-address", help="--ray: address of a running Ray cluster (default: start a local one)")
    s.set_defaults(fn=cmd_serve)


def configure_serve_key(k) -> None:
    k.describe("Create an API key for `trawmem serve`: the key is printed once on stdout, and only its sha256 is "
               "stored in the keys file, with the tenant and the bank-id patterns it may read (and append to).")
    k.add_argument("--keys", required=True, help="keys file to add to (created when missing)")
    k.add_argument("--tenant", required=True, help="tenant name the key belongs to")
    k.add_argument("--banks", nargs="+", required=True, help="bank-id patterns the key owns, e.g. 'acme-*'")
    k.add_argument("--read-only", action="store_true", help="may select but not append")
    k.set_defaults(fn=cmd_serve_key)

