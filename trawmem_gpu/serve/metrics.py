"""Prometheus metrics of the service (``prometheus_client``, one registry per app).

Route labels are route *templates* (``/v1/banks/{bank_id}/turns``), never raw paths, so no
bank id, key or question reaches a label, and cardinality stays fixed.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("trawmem_http_requests", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("trawmem_http_request_seconds", "HTTP request latency by route",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("trawmem_batch_size", "Queries per engine batch", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.batch_seconds = Histogram("trawmem_batch_seconds", "Batch worker seconds per batch and stage (encode, "
                                       "select, total)", ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.assemble_seconds = Histogram("trawmem_assemble_seconds", "Seconds to assemble one workspace (group, "
                                          "render, count tokens)", buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("trawmem_queue_depth", "Queries waiting for a batch", registry=r)
        self.in_flight = Gauge("trawmem_http_in_flight", "HTTP requests being handled", registry=r)
        self.appended = Counter("trawmem_appended_turns", "Turns appended to banks", registry=r)
        self.engine_builds = Gauge("trawmem_engine_builds", "Selection engines built since start", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
