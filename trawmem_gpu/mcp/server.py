"""``trawmem mcp``: the memory as a Model Context Protocol server, on the official ``mcp`` SDK.

Five tools over one :class:`~trawmem_gpu.memory.Memory` (the engine the CLI and ``trawmem
serve`` run): ``add_turns``, ``recall`` (the workspace for a question under a token budget),
``forget`` (the turns named), ``forget_bank`` (a whole bank: its own tool, so no missing or
misspelled argument ever widens a forget to the bank) and ``list_banks``.

Every tool refuses an argument it does not take (its input schema says
``additionalProperties: false``), and its arguments carry the bounds of ``trawmem serve``: an
``add_turns`` holds at most ``max_turns_per_append`` turns, a ``forget`` at most
``MAX_FORGET_IDS`` ids, ids, texts and questions the HTTP models' lengths.

Transports:

* **stdio** (the default), for a desktop assistant that starts the command itself. The caller is
  the local user: every bank, or the banks matching ``--banks`` patterns (``--read-only``: no
  ``add_turns`` or ``forget``).
* **streamable HTTP** (``--http``), on 127.0.0.1 unless a keys file is given, with the tenant keys
  of ``trawmem serve`` (``serve/keys.py``, made by ``trawmem serve-key``): each request sends
  ``Authorization: Bearer KEY`` (or ``X-API-Key``); no key or an unknown one is answered 401 before
  the MCP layer; a tool sees only the banks its key owns, a foreign bank answers exactly like a
  missing one, and a read-only key may recall and list but not add or forget. A key bound to a
  filter (``trawmem serve-key --where``) recalls only turns that pass it (a ``recall``'s own
  ``where`` is AND-ed with it), adds only such turns, forgets only such turns by id (others are
  reported missing), and cannot ``forget_bank``.

A tool's failure (an unknown bank, a malformed turn, a budget out of range, an unknown argument)
is a tool error whose text names the field and the reason (``turns[0].text: String should have at
most 131072 characters``: ``data.types.MAX_TEXT_CHARS``), for the model to read; the server keeps serving.

(No ``from __future__ import annotations`` here: the SDK reads the tools' parameter and result
types from their annotations, which name classes local to :func:`build_server`.)
"""
from typing import Any, Callable, Mapping

from ..errors import TrawmemError, UnknownBank

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_SHOWN_ERRORS = 5
"""Field errors one tool error spells out (then ``... (N more)``)."""


def _where(loc) -> str:
    """``("turns", 0, "text")`` -> ``turns[0].text``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def field_errors(exc, takes: tuple[str, ...] | None = None, hints: Mapping[str, str] | None = None) -> str:
    """A pydantic ``ValidationError`` as one line naming each field and the reason
    (``turn_ids: required (forget_bank forgets a whole bank); turns_ids_typo: unknown argument
    (forget takes bank_id, turn_ids)``).

    :param takes: the arguments of the tool, when ``exc`` is about its arguments (named when an
        unknown one is refused)
    :param hints: argument -> a hint added when it is missing
    """
    parts = []
    errors = exc.errors(include_url=False, include_input=False)
    for e in errors[:MAX_SHOWN_ERRORS]:
        loc, kind = tuple(e["loc"]), e["type"]
        if kind == "extra_forbidden" and len(loc) == 1 and takes is not None:
            why = f"unknown argument (takes {', '.join(takes) or 'none'})"
        elif kind == "extra_forbidden":
            why = "unknown field"
        elif kind == "missing":
            why = "required"
            if len(loc) == 1 and hints and loc[0] in hints:
                why += f" ({hints[loc[0]]})"
        else:
            why = e["msg"]
        parts.append(f"{_where(loc)}: {why}" if loc else why)
    if len(errors) > MAX_SHOWN_ERRORS:
        parts.append(f"... ({len(errors) - MAX_SHOWN_ERRORS} more)")
    return "; ".join(parts)


def strict_tool(fn, *, description: str, hints: Mapping[str, str] | None = None, **annotations):
    """The SDK's ``Tool`` for ``fn`` whose argument model forbids extra arguments (so the input
    schema says ``additionalProperties: false``, and a misspelled argument is refused, never
    dropped), and whose argument errors read as :func:`field_errors`.

    :param annotations: ``ToolAnnotations`` fields (``read_only_hint``, ``destructive_hint``, ...)
    """
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from mcp.server.mcpserver.tools import Tool
    from mcp_types import ToolAnnotations
    from pydantic import ConfigDict, ValidationError

    class StrictTool(Tool):
        async def run(self, arguments, context, convert_result: bool = False):
            try:
                return await super().run(arguments, context, convert_result=convert_result)
            except ToolError as e:  # the SDK's own argument check: its text, one line in field terms
                cause = e.__cause__
                if isinstance(e, UnexpectedToolError) or not isinstance(cause, ValidationError):
                    raise
                fields = self.fn_metadata.arg_model.model_fields
                takes = tuple(f.alias or name for name, f in fields.items())
                raise ToolError(f"Error executing tool {self.name}: "
                                f"{field_errors(cause, takes, hints)}") from cause

    tool = StrictTool.from_function(fn, description=description,
                                    annotations=ToolAnnotations(open_world_hint=False, **annotations))
    loose = tool.fn_metadata.arg_model
    strict = type(loose.__name__, (loose,), {"model_config": ConfigDict(extra="forbid"),
                                             "__module__": loose.__module__})
    meta = tool.fn_metadata.model_copy(update={"arg_model": strict})
    return tool.model_copy(update={"fn_metadata": meta, "parameters": strict.model_json_schema(by_alias=True)})


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


class _Guard:
    """What every tool checks and how it calls the memory: the caller's tenant (None refuses the
    call), that it owns the bank (a foreign bank answers as a missing one), that it may write;
    and :meth:`run`, the memory call on a worker thread with the package's errors as tool errors."""

    def __init__(self, memory, tenant_of: Callable[[Any], Any]):
        self.memory, self.tenant_of = memory, tenant_of

    def tenant(self, ctx, bank_id: str | None = None, write: bool = False) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError

        t = self.tenant_of(ctx)
        if t is None:
            raise ToolError("missing or invalid API key")
        if bank_id is not None and not t.owns(bank_id):
            raise ToolError(f"unknown bank id {bank_id!r}")
        if write and not t.writable:
            raise ToolError("this API key is read-only")
        return t

    async def run(self, method: str, *args, **kw):
        import anyio
        from mcp.server.mcpserver.exceptions import ToolError
        from pydantic import ValidationError

        fn = getattr(self.memory, method)
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kw))
        except UnknownBank as e:  # never e.detail: what else is held is not the caller's
            raise ToolError(f"unknown bank id {e.bank_id!r}") from None
        except TrawmemError as e:
            raise ToolError(str(e)) from None
        except ValidationError as e:  # a schema the package checks with pydantic: in field terms too
            raise ToolError(field_errors(e)) from None


def _within(tenant) -> dict:
    """The ``within=`` of a ``Memory`` call for ``tenant``: its bound filter (``memory.scope``), or
    nothing for a key bound to none (the call is then exactly the unbound one)."""
    return {} if tenant.where is None else {"within": tenant.where}


def _answers():
    """The tools' answer models (structured output): the workspace (the tool's own shape), and the
    parts of the server's wire models (``serve.models``) that the other tools answer with."""
    from types import SimpleNamespace

    from pydantic import BaseModel, Field

    from ..serve.models import AppendResponse, BankSummary, ForgetResponse, part_of

    class Workspace(BaseModel):
        bank_id: str
        text: str = Field(description="the workspace to put into the prompt: one heading per thread, a line per turn")
        unit_ids: list[str] = Field(description="the selected turns' ids, in the order the text shows them")
        tokens: int = Field(description="tokens of text (cl100k_base)")

    row = ("bank_id", "n_units", "n_threads")
    return SimpleNamespace(
        Workspace=Workspace, BankRow=part_of(BankSummary, row, "BankRow"),
        Added=part_of(AppendResponse, (*row, "created", "appended", "stored", "already_stored", "refused", "items"),
                      "Added"),
        Forgotten=part_of(ForgetResponse, ("bank_id", "forgotten", "missing", "deleted"), "Forgotten"))


def _bank_id_type():
    from typing import Annotated

    from pydantic import Field

    from ..data.types import MAX_ID_CHARS

    return Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, description="the memory bank's id")]


def _write_tools(g: _Guard, A) -> list:
    """``add_turns``, ``forget`` and ``forget_bank``, with the write caps of ``trawmem serve``."""
    from typing import Annotated

    from mcp.server.mcpserver import Context
    from pydantic import Field, WithJsonSchema

    from ..data.types import MAX_ID_CHARS
    from ..serve.config import ServeConfig
    from ..serve.models import MAX_FORGET_IDS, MessageIn, TurnIn

    BankId = _bank_id_type()
    # Any item (not dict), as the HTTP route's AppendRequest: an item that is not an object is
    # refused alone by the Memory core, answered in `items`, not the whole call (issue 42 item 7)
    Turns = Annotated[list[Annotated[Any, WithJsonSchema(TurnIn.model_json_schema())]] | None, Field(
        min_length=1, max_length=ServeConfig.max_turns_per_append,
        description="turns in source order, after the bank's last turn (or give messages)")]
    Messages = Annotated[list[Annotated[Any, WithJsonSchema(MessageIn.model_json_schema())]] | None, Field(
        min_length=1, max_length=ServeConfig.max_turns_per_append,
        description="chat messages ({role, content, name}) instead of turns")]
    Speakers = Annotated[dict[str, Annotated[str, Field(max_length=256)]] | None, Field(
        max_length=8, description="messages: role -> speaker name for messages without a name")]
    Roles = Annotated[list[Annotated[str, Field(max_length=32)]] | None, Field(
        max_length=8, description="messages: the roles stored (default user and assistant)")]
    TurnIds = Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]],
                        Field(min_length=1, max_length=MAX_FORGET_IDS, description="ids of the turns to forget")]

    async def add_turns(bank_id: BankId, ctx: Context, turns: Turns = None, messages: Messages = None,
                        speakers: Speakers = None, roles: Roles = None, atomic: bool = False) -> A.Added:
        from mcp.server.mcpserver.exceptions import ToolError

        t = g.tenant(ctx, bank_id, write=True)
        field, items = ("turns", turns) if turns is not None else ("messages", messages or [])
        bad = next((i for i, r in enumerate(items) if isinstance(r, dict) and not t.may_store(r.get("metadata"))), None)
        if bad is not None:  # a key bound to a filter stores only what it could recall
            raise ToolError(f"{field}[{bad}].metadata: does not pass this API key's filter {t.where.key}; "
                            "nothing was stored")
        res = await g.run("add", bank_id, turns, messages=messages, speakers=speakers, roles=roles, atomic=atomic,
                          **_within(t))  # a bound key: its own turns' counts, refusals naming none else
        return A.Added(**{k: res[k] for k in A.Added.model_fields})

    def forgotten(bank_id: str, res: dict):
        return A.Forgotten(bank_id=bank_id, forgotten=list(res.get("forgotten") or []),
                           missing=list(res.get("missing") or []), deleted=bool(res.get("deleted")))

    async def forget(bank_id: BankId, turn_ids: TurnIds, ctx: Context) -> A.Forgotten:
        t = g.tenant(ctx, bank_id, write=True)  # a bound key: only its own turns (memory.scope.forget_within)
        return forgotten(bank_id, await g.run("forget", bank_id, list(dict.fromkeys(turn_ids)), **_within(t)))

    async def forget_bank(bank_id: BankId, ctx: Context) -> A.Forgotten:
        from mcp.server.mcpserver.exceptions import ToolError

        if g.tenant(ctx, bank_id, write=True).where is not None:
            raise ToolError("this API key is bound to a filter: it forgets turns by id (forget), not a whole bank")
        return forgotten(bank_id, await g.run("forget", bank_id, None))

    return [
        strict_tool(add_turns, description=(
            "Store new conversation turns in a memory bank (the first add creates the bank). Each turn: turn_id, "
            f"speaker, text, timestamp (ISO 8601), optional caption, session and metadata (a flat map such as "
            f"{{\"user_id\": \"u1\"}} that recall's where filters on); or give chat messages "
            f"({{role, content, name}}) instead; at most {ServeConfig.max_turns_per_append} a call. Each item is "
            "answered: stored, already_stored, refused (with its field and reason) or skipped; atomic=true refuses "
            "the whole call when one item is refused."), hints={"turns": "give turns or messages"},
            destructive_hint=False),
        strict_tool(forget, description=(
            "Forget the turns turn_ids of a memory bank everywhere: the bank, the caches and the engine. "
            "(forget_bank forgets a whole bank.)"), hints={"turn_ids": "forget_bank forgets a whole bank"},
            destructive_hint=True, idempotent_hint=True),
        strict_tool(forget_bank, description=(
            "Forget a whole memory bank, every turn of it, everywhere: the bank, the caches and the engine."),
            destructive_hint=True, idempotent_hint=True),
    ]


def _read_tools(g: _Guard, A, default_token_budget: int) -> list:
    """``recall`` and ``list_banks``, with the question and token-budget bounds of ``trawmem serve``."""
    from typing import Annotated

    from mcp.server.mcpserver import Context
    from pydantic import Field

    from ..select.params import SERVED_LIMITS
    from ..serve.models import MAX_DATE_CHARS, WHERE_DOC

    BankId = _bank_id_type()
    Question = Annotated[str, Field(min_length=1, max_length=SERVED_LIMITS.max_question_chars)]
    TokenBudget = Annotated[int, Field(ge=1, le=SERVED_LIMITS.max_token_budget)] | None
    Date = Annotated[str, Field(max_length=MAX_DATE_CHARS)] | None
    Where = Annotated[dict[str, Any], Field(description=WHERE_DOC)] | None

    async def recall(bank_id: BankId, question: Question, ctx: Context, token_budget: TokenBudget = None,
                     date: Date = None, as_of: Date = None, where: Where = None) -> A.Workspace:
        from mcp.server.mcpserver.exceptions import ToolError

        from ..errors import InputError

        t = g.tenant(ctx, bank_id)
        tb = default_token_budget if token_budget is None else token_budget
        try:  # the call's filter, narrowed by the key's (never widened)
            flt = t.narrowed(where)
        except InputError as e:
            raise ToolError(str(e)) from None
        # the request's T over the tool's default T; the Memory merges it over its own defaults
        ws = await g.run("select", bank_id, question, token_budget=tb, date=date, where=flt,
                         **({"as_of": as_of} if as_of is not None else {}))
        return A.Workspace(bank_id=bank_id, text=ws.text, unit_ids=list(ws.unit_ids), tokens=ws.tokens)

    async def list_banks(ctx: Context) -> list[A.BankRow]:
        t = g.tenant(ctx)
        rows = await g.run("banks", **_within(t))  # a bound key: its own turns' counts (memory.scope)
        return [A.BankRow(**{k: r[k] for k in A.BankRow.model_fields}) for r in rows if t.owns(r["bank_id"])]

    return [
        strict_tool(recall, description=(
            "Recall what is relevant to a question from a memory bank: a workspace of past turns that fits in "
            "token_budget tokens, to read before answering; as_of (a date) shows the facts that held then "
            "instead of the current ones; where (optional) filters the turns by their metadata, e.g. "
            "{\"user_id\": \"u1\"}: only turns that pass are considered."), read_only_hint=True),
        strict_tool(list_banks, description="List the memory banks this caller can see, with their sizes.",
                    read_only_hint=True),
    ]


def build_server(memory, tenant_of: Callable[[Any], Any], *, default_token_budget: int = 800,
                 name: str = "trawmem", log_level: str = "WARNING"):
    """The ``MCPServer`` with the five tools over ``memory``.

    :param tenant_of: the :class:`~trawmem_gpu.serve.keys.Tenant` of a tool call, from its MCP
        ``Context`` (stdio: a fixed tenant; HTTP: the request's key); None refuses the call
    :param default_token_budget: a ``recall``'s token budget when the caller gives none
    :param log_level: the SDK's logging level (``trawmem mcp --log-level``)
    """
    from mcp.server.mcpserver import MCPServer

    g, A = _Guard(memory, tenant_of), _answers()
    return MCPServer(name, log_level=log_level.upper(), tools=[*_write_tools(g, A), *_read_tools(
        g, A, default_token_budget)], instructions=(
        "Long-term memory of past conversations. Call `recall` with the user's question to get a short workspace "
        "of the relevant past turns to read before answering; `add_turns` to store new turns; `forget` with the "
        "turn ids when the user asks to forget something (`forget_bank` forgets a whole bank); `list_banks` to "
        "see which memory banks exist."))


def http_app(memory, keys=None, *, host: str = "127.0.0.1", token_budget: int = 800, tenant=None,
             log_level: str = "WARNING"):
    """The streamable-HTTP ASGI app (``/mcp``): with ``keys`` (a ``KeyStore``) each request's key
    names its tenant (401 without one), else every request is ``tenant`` (default: all banks)."""
    from ..serve.keys import LOCAL_TENANT

    if keys is None:
        fixed = tenant or LOCAL_TENANT
        tenant_of = lambda ctx: fixed  # noqa: E731
    else:
        tenant_of = lambda ctx: keys.authenticate(presented_key(ctx.headers))  # noqa: E731
    server = build_server(memory, tenant_of, default_token_budget=token_budget, log_level=log_level)
    app = server.streamable_http_app(host=host, stateless_http=True, json_response=True)
    return KeyGate(app, keys) if keys is not None else app
