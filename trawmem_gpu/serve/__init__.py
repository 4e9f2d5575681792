"""``trawmem serve``: workspace selection as an HTTP service (the pipeline's last stage).

An agent framework or an LLM gateway asks, for every user turn, "which memories go into this
prompt?" (``POST /v1/select``) and appends the turn once answered
(``POST /v1/banks/{bank_id}/turns``), and forgets on request (``DELETE /v1/banks/{bank_id}``,
``DELETE /v1/banks/{bank_id}/turns/{turn_id}``). Concurrent questions are coalesced into one
encoder call and one engine call (:mod:`.batcher`); the banks, the engine, appends and forgets
are the Memory core's (:mod:`trawmem_gpu.memory`, the Python API's), which rebuilds only the
touched bank and refreshes the engine bank by bank; API keys map to tenants scoped to bank-id
patterns (:mod:`.keys`).

Why this stack (extra ``serve``):

* **FastAPI** on **uvicorn**: an ASGI app whose request/response models (pydantic) give the
  validation and the OpenAPI schema (``/openapi.json``, ``/docs``) from one definition, with
  one asyncio event loop per process, which is what a dynamic batcher needs (many waiting
  requests, one dispatcher, work handed to threads); uvicorn (with httptools / uvloop when
  installed) is the standard, maintained ASGI server and supports graceful shutdown. The same
  ASGI app runs unchanged as a Ray Serve ingress (``--ray``, :mod:`.ray_app`).
* **prometheus_client**: the reference client for the Prometheus text format; counters,
  histograms and gauges on a per-app registry.

Modules: ``config`` (options), ``models`` (API bodies: the wire models), ``backend`` (the one
interface the routes are written against, and its in-process implementation), ``keys`` (tenants), ``batcher``
(dynamic batching), ``service`` (one process's service over the Memory core's engine and
banks, :mod:`trawmem_gpu.memory.engines` and :mod:`trawmem_gpu.memory.banks`),
``metrics``, ``app`` (routes), ``proxy`` and ``proxy_stream`` (the chat-completions proxy, ``--upstream``),
``server`` (uvicorn), ``remote`` (HTTP in front processes,
``--http-workers``), ``ray_app`` (Ray Serve); the commands are ``trawmem_gpu.cli.serve``.
Only ``app``, ``proxy*``, ``metrics``, ``server``, ``remote`` (its fronts) and ``ray_app`` import the extras.
"""
from .config import ServeConfig

__all__ = ["ServeConfig"]
