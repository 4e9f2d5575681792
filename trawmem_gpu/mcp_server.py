"""``trawmem mcp``: the memory as a Model Context Protocol server, on the official ``mcp`` SDK.

Four tools over one :class:`~trawmem_gpu.memory.Memory` (the engine the CLI and ``trawmem
serve`` run): ``add_turns``, ``recall`` (the workspace for a question under a token budget),
``forget`` (turns or a whole bank) and ``list_banks``.

Transports:

* **stdio** (the default), for a desktop assistant that starts the command itself. The caller is
  the local user: every bank, or the banks matching ``--banks`` patterns (``--read-only``: no
  ``add_turns`` or ``forget``).
* **streamable HTTP** (``--http``), on 127.0.0.1 unless a keys file is given, with the tenant keys
  of ``trawmem serve`` (``serve/keys.py``, made by ``trawmem serve-key``): each request sends
  ``Authorization: Bearer KEY`` (or ``X-API-Key``); no key or an unknown one is answered 401 before
  the MCP layer; a tool sees only the banks its key owns, a foreign bank answers exactly like a
  missing one, and a read-only key may recall and list but not add or forget.

A tool's failure (an unknown bank, a malformed turn, a budget out of range) is a tool error whose
text names the field, for the model to read; the server keeps serving.

(No ``from __future__ import annotations`` here: the SDK reads the tools' parameter and result
types from their annotations, which name classes local to :func:`build_server`.)
"""
from typing import Any, Callable, Mapping

from .errors import TrawmemError, UnknownBank

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def presented_key(headers: Mapping[str, str] | None) -> str | None:
    """The API key an HTTP request presents: ``Authorization: Bearer KEY``, else ``X-API-Key``."""
    if not headers:
        return None
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key") or None


class KeyGate:
    """Pure ASGI middleware: HTTP requests without a key the keys file holds get 401 (JSON
    ``{"detail": ...}``, as ``trawmem serve`` answers), before any MCP work."""

    def __init__(self, app, keys):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
            if self.keys.authenticate(presented_key(headers)) is None:
                body = b'{"detail": "missing or invalid API key"}'
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def build_server(memory, tenant_of: Callable[[Any], Any], *, default_token_budget: int = 800,
                 name: str = "trawmem"):
    """The ``MCPServer`` with the four tools over ``memory``.

    :param tenant_of: the :class:`~trawmem_gpu.serve.keys.Tenant` of a tool call, from its MCP
        ``Context`` (stdio: a fixed tenant; HTTP: the request's key); None refuses the call
    :param default_token_budget: a ``recall``'s token budget when the caller gives none
    """
    import anyio
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import BaseModel, Field

    from .serve.config import ServeConfig
    from .serve.models import TurnIn

    max_token_budget = ServeConfig.max_token_budget  # the largest a request to `trawmem serve` may ask for

    class Workspace(BaseModel):
        bank_id: str
        text: str = Field(description="the workspace to put into the prompt: one heading per thread, a line per turn")
        unit_ids: list[str] = Field(description="the selected turns' ids, in the order the text shows them")
        tokens: int = Field(description="tokens of text (cl100k_base)")

    class BankRow(BaseModel):
        bank_id: str
        n_units: int
        n_threads: int

    class Added(BankRow):
        created: bool
        appended: int

    class Forgotten(BaseModel):
        bank_id: str
        forgotten: list[str] = Field(description="turn ids removed (every turn of the bank when the whole bank went)")
        missing: list[str] = Field(description="turn ids the bank did not hold")
        deleted: bool = Field(description="whether the whole bank is gone")

    server = MCPServer(name, log_level="WARNING", instructions=(
        "Long-term memory of past conversations. Call `recall` with the user's question to get a short workspace "
        "of the relevant past turns to read before answering; `add_turns` to store new turns; `forget` when the "
        "user asks to forget something; `list_banks` to see which memory banks exist."))

    def tenant(ctx) -> Any:
        t = tenant_of(ctx)
        if t is None:
            raise ToolError("missing or invalid API key")
        return t

    def owned(t, bank_id: str) -> None:
        if not t.owns(bank_id):  # a foreign bank answers as a missing one
            raise ToolError(f"unknown bank id {bank_id!r}")

    def writable(t) -> None:
        if not t.writable:
            raise ToolError("this API key is read-only")

    async def run(fn, *args, **kw):
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kw))
        except UnknownBank as e:  # never e.detail: what else is held is not the caller's
            raise ToolError(f"unknown bank id {e.bank_id!r}") from None
        except TrawmemError as e:
            raise ToolError(str(e)) from None

    @server.tool(description="Store new conversation turns in a memory bank (the first add creates the bank). "
                             "Each turn: turn_id, speaker, text, timestamp (ISO 8601), optional caption and session.")
    async def add_turns(bank_id: str, turns: list[TurnIn], ctx: Context) -> Added:
        t = tenant(ctx)
        owned(t, bank_id)
        writable(t)
        if not turns:
            raise ToolError("turns is empty")
        res = await run(memory.add, bank_id, [x.model_dump(exclude_none=True) for x in turns])
        return Added(**{k: res[k] for k in Added.model_fields})

    @server.tool(description="Recall what is relevant to a question from a memory bank: a workspace of past turns "
                             "that fits in token_budget tokens, to read before answering.")
    async def recall(bank_id: str, question: str, ctx: Context, token_budget: int | None = None,
                     date: str | None = None) -> Workspace:
        t = tenant(ctx)
        owned(t, bank_id)
        tb = default_token_budget if token_budget is None else token_budget
        if not 1 <= tb <= max_token_budget:
            raise ToolError(f"token_budget must lie in 1..{max_token_budget}, got {tb}")
        ws = await run(memory.select, bank_id, question, token_budget=tb, date=date)
        return Workspace(bank_id=bank_id, text=ws.text, unit_ids=list(ws.unit_ids), tokens=ws.tokens)

    @server.tool(description="Forget turns of a memory bank (turn_ids), or the whole bank (no turn_ids), "
                             "everywhere: the bank, the caches and the engine.")
    async def forget(bank_id: str, ctx: Context, turn_ids: list[str] | None = None) -> Forgotten:
        t = tenant(ctx)
        owned(t, bank_id)
        writable(t)
        if turn_ids is not None and not turn_ids:
            raise ToolError("turn_ids is empty (leave it out to forget the whole bank)")
        res = await run(memory.forget, bank_id, turn_ids)
        return Forgotten(bank_id=bank_id, forgotten=list(res.get("forgotten") or []),
                         missing=list(res.get("missing") or []), deleted=bool(res.get("deleted")))

    @server.tool(description="List the memory banks this caller can see, with their sizes.")
    async def list_banks(ctx: Context) -> list[BankRow]:
        t = tenant(ctx)
        rows = await run(memory.banks)
        return [BankRow(**{k: r[k] for k in BankRow.model_fields}) for r in rows if t.owns(r["bank_id"])]

    return server


def http_app(memory, keys=None, *, host: str = "127.0.0.1", token_budget: int = 800, tenant=None):
    """The streamable-HTTP ASGI app (``/mcp``): with ``keys`` (a ``KeyStore``) each request's key
    names its tenant (401 without one), else every request is ``tenant`` (default: all banks)."""
    from .serve.keys import LOCAL_TENANT

    if keys is None:
        fixed = tenant or LOCAL_TENANT
        tenant_of = lambda ctx: fixed  # noqa: E731
    else:
        tenant_of = lambda ctx: keys.authenticate(presented_key(ctx.headers))  # noqa: E731
    server = build_server(memory, tenant_of, default_token_budget=token_budget)
    app = server.streamable_http_app(host=host, stateless_http=True, json_response=True)
    return KeyGate(app, keys) if keys is not None else app
