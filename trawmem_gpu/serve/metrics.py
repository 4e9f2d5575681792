"""Prometheus metrics of the service (``prometheus_client``, one registry per app).

Route labels are route *templates* (``/v1/banks/{bank_id}/turns``), never raw paths, so no
bank id, key or question reaches a label, and cardinality stays fixed.

One process (``trawmem serve``) has every family. With ``--http-workers N`` the HTTP families
live in the front processes, in ``prometheus_client``'s multiprocess mode (summed over the
fronts at each scrape, whichever front answers it), and the engine families live in the engine
process, which sends its exposition text to the front for each scrape (:mod:`.remote`).
"""
from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The service's metric families.

    :param part: ``all`` (one process), ``http`` (a front process: requests, latency, in flight)
        or ``engine`` (the engine process: batches, assembly, queue depth, appends, engines);
        the families of the other part are ``None``
    :param multiprocess_dir: a front's ``PROMETHEUS_MULTIPROC_DIR`` (set in its environment before
        ``prometheus_client`` was imported): :meth:`render` then sums every front's files
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, part: Literal["all", "http", "engine"] = "all", multiprocess_dir: str | None = None):
        r = self.registry = CollectorRegistry()
        self.multiprocess_dir = multiprocess_dir
        http, engine = part in ("all", "http"), part in ("all", "engine")
        self.requests = Counter("trawmem_http_requests", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=r) if http else None
        self.latency = Histogram("trawmem_http_request_seconds", "HTTP request latency by route",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=r) if http else None
        self.in_flight = Gauge("trawmem_http_in_flight", "HTTP requests being handled", registry=r,
                               multiprocess_mode="livesum") if http else None
        self.proxy_requests = Counter("trawmem_proxy_requests", "Chat completions proxied, by outcome (ok, "
                                      "upstream_error, timeout, unreachable, refused)", ["outcome"],
                                      registry=r) if http else None
        self.proxy_workspace_tokens = Histogram("trawmem_proxy_workspace_tokens", "Tokens of the workspace placed "
                                                "in a proxied request (the model's own where the upstream counts them)",
                                                buckets=TOKEN_BUCKETS, registry=r) if http else None
        self.proxy_upstream_seconds = Histogram("trawmem_proxy_upstream_seconds", "Seconds from forwarding to the "
                                                "upstream's last byte", buckets=LATENCY_BUCKETS, registry=r) if http else None
        self.proxy_appends = Counter("trawmem_proxy_appends", "Proxied exchanges appended after the answer, by "
                                     "outcome (stored, retry, skipped, failed)", ["outcome"], registry=r) if http else None
        self.batch_size = Histogram("trawmem_batch_size", "Queries per engine batch", buckets=BATCH_BUCKETS,
                                    registry=r) if engine else None
        self.batch_seconds = Histogram("trawmem_batch_seconds", "Batch worker seconds per batch and stage (encode, "
                                       "select, total)", ["stage"], buckets=LATENCY_BUCKETS, registry=r) if engine else None
        self.assemble_seconds = Histogram("trawmem_assemble_seconds", "Seconds to assemble one workspace (group, "
                                          "render, count tokens)", buckets=LATENCY_BUCKETS, registry=r) if engine else None
        self.queue_depth = Gauge("trawmem_queue_depth", "Queries waiting for a batch", registry=r) if engine else None
        self.appended = Counter("trawmem_appended_turns", "Turns appended to banks", registry=r) if engine else None
        self.engine_builds = Gauge("trawmem_engine_builds", "Selection engines built since start",
                                   registry=r) if engine else None

    def watch_llm(self, backend) -> None:
        """Expose ``backend``'s LLM work (``llm.base.UsageMeter``) as counters read at each scrape:
        ``trawmem_llm_<count>_total{stage}`` for calls, requests, cache hits, errors, retries, prompt
        and completion tokens, replies cut at the token limit, structured replies read, malformed,
        refused and fallen back, and ``trawmem_llm_seconds_total{stage}``."""
        if self.queue_depth is None:  # the engine's families live in the engine process
            return
        self.registry.register(_LLMCollector(backend))

    def render(self) -> bytes:
        if self.multiprocess_dir:
            from prometheus_client import multiprocess

            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg, path=self.multiprocess_dir)
            return generate_latest(reg)
        return generate_latest(self.registry)


class _LLMCollector:
    """The LLM work of one backend as Prometheus counters (:meth:`Metrics.watch_llm`)."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        from ..llm.base import USAGE_COUNTS

        stages = self.backend.usage.summary()
        for k in USAGE_COUNTS:
            fam = CounterMetricFamily(f"trawmem_llm_{k}", f"LLM {k.replace('_', ' ')} by stage", labels=["stage"])
            for stage, u in stages.items():
                fam.add_metric([stage], float(u.get(k, 0)))
            yield fam
        fam = CounterMetricFamily("trawmem_llm_seconds", "Wall seconds of LLM calls by stage", labels=["stage"])
        for stage, u in stages.items():
            fam.add_metric([stage], float(u.get("wall_s", 0.0)))
        yield fam
