"""``POST /v1/chat/completions``: OpenAI's chat-completions route in front of an inference server
(``trawmem serve --upstream URL``), with a workspace placed in the messages and the exchange
appended to the bank afterwards. A thin front: the key, the bank, the selection and the append
are the other routes' (``RouteContext``, the Backend's ``select`` and ``append``); the upstream
side is :mod:`.proxy_stream`.

For a request (docs/serving.md, "Chat-completions proxy"):

1. the caller's key (``Authorization: Bearer`` / ``X-API-Key``, as every route; never forwarded);
2. the bank: the ``X-Trawmem-Bank`` header, else the body's ``user`` field (the header wins); a
   bank the key does not own is a 404 before anything is forwarded; a bank the key owns but that
   does not exist yet gets no workspace (the append creates it);
3. the workspace for the last ``user`` message under the token budget: the
   ``X-Trawmem-Token-Budget`` header, else the body's ``trawmem.token_budget``, else the key's
   ``token_budget``, else the server's ``proxy_token_budget``; a bound key's filter applies;
4. placed as one system message (:data:`HEADER` and the workspace text) right before the first
   message that is not a system (or developer) message, so the caller's own system prompt stays
   first; counted in the model's tokens where the upstream has ``/tokenize`` and, when over the
   budget, selected once more under ``budget * budget / counted``; the count goes back in
   ``X-Trawmem-Workspace-Tokens``;
5. forwarded (``trawmem`` removed from the body), the answer passed back as it came;
6. after a complete 200 answer, the user message and the answer are appended as two turns on a
   background task, with ids from a hash of the bank, the messages and the answer (a retried
   identical request finds them held, or is refused as holding them, and appends nothing) and the body's ``trawmem.metadata``
   (a key bound to a filter must name metadata that passes it: else 403 before forwarding).
   A read-only key gets its workspace and nothing is stored.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math

from fastapi import FastAPI, Request

from ..errors import DuplicateTurns, InputError, TrawmemError, loads_json
from ..memory.banks import check_bank_id
from .appends import append_batch
from .models import SelectRequest
from .proxy_stream import ProxyRefusal, Upstream, openai_error
from .replies import HTTPError

log = logging.getLogger(__name__)

HEADER = "Memory: earlier conversation turns selected for this message (quote them only where relevant):\n\n"
"""The first line of the placed system message; the workspace's text follows."""
BANK_HEADER = "x-trawmem-bank"
BUDGET_HEADER = "x-trawmem-token-budget"
TOKENS_HEADER = "X-Trawmem-Workspace-Tokens"
OWN_FIELD = "trawmem"
"""The body field the proxy reads (``token_budget``, ``metadata``) and removes before forwarding."""
OWN_KEYS = ("token_budget", "metadata")
LEADING_ROLES = ("system", "developer")


def _content_text(content, where: str) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ProxyRefusal(400, f"{where}.content must be a string or a list of content parts", where + ".content")


def _budget_of(raw, where: str) -> int:
    if isinstance(raw, str):
        raw = raw.strip()
        if not raw.isdigit():
            raise ProxyRefusal(400, f"{where} must be a whole number >= 1, got {raw[:40]!r}", where)
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ProxyRefusal(400, f"{where} must be a whole number >= 1, got {str(raw)[:40]}", where)
    return raw


class ChatRequest:
    """A chat-completions body read and checked (``ProxyRefusal`` naming the field); nothing is
    forwarded or stored for a refused one."""

    def __init__(self, raw: bytes, headers, default_budget: int):
        try:
            body = loads_json(raw)
        except ValueError:
            raise ProxyRefusal(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ProxyRefusal(400, "the body must be a JSON object")
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ProxyRefusal(400, "messages must be a non-empty list of chat messages", "messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ProxyRefusal(400, f"messages[{i}] must be an object with a string role", f"messages[{i}]")
        n = body.get("n", 1)
        if n != 1 or isinstance(n, bool):
            raise ProxyRefusal(400, f"n must be 1 on this proxy (one answer is appended to the bank), got {n!r}", "n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ProxyRefusal(400, "stream must be true or false", "stream")
        own = body.pop(OWN_FIELD, None) or {}
        if not isinstance(own, dict) or set(own) - set(OWN_KEYS):
            raise ProxyRefusal(400, f"{OWN_FIELD} must be an object with keys among {OWN_KEYS}", OWN_FIELD)
        last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i]["role"] == "user"), None)
        if last is None:
            raise ProxyRefusal(400, "messages holds no user message (the workspace is selected for the last one)",
                               "messages")
        self.question = _content_text(msgs[last].get("content"), f"messages[{last}]")
        if not self.question.strip():
            raise ProxyRefusal(400, f"messages[{last}].content holds no text", f"messages[{last}].content")
        bank = headers.get(BANK_HEADER) or body.get("user")
        where = "X-Trawmem-Bank" if headers.get(BANK_HEADER) else "user"
        if not isinstance(bank, str) or not bank:
            raise ProxyRefusal(400, "name the bank: the X-Trawmem-Bank header or the body's user field", "user")
        try:
            check_bank_id(bank)
        except InputError as e:
            raise ProxyRefusal(400, f"{where}: {e}", where) from None
        self.budget_field = None  # where the budget came from (None: the key's or the server's)
        if headers.get(BUDGET_HEADER) is not None:
            self.budget_field = "X-Trawmem-Token-Budget"
            self.budget = _budget_of(headers[BUDGET_HEADER], self.budget_field)
        elif own.get("token_budget") is not None:
            self.budget_field = f"{OWN_FIELD}.token_budget"
            self.budget = _budget_of(own["token_budget"], self.budget_field)
        else:
            self.budget = default_budget
        self.metadata = own.get("metadata")
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise ProxyRefusal(400, f"{OWN_FIELD}.metadata must be an object", f"{OWN_FIELD}.metadata")
        self.body, self.bank, self.stream, self.last = body, bank, stream, last

    def turn_ids(self, answer: str) -> tuple[str, str]:
        """The two turns' ids: a hash of the bank, the messages up to the last user one and the answer."""
        h = hashlib.sha256(json.dumps([self.bank, self.body["messages"][:self.last + 1], answer],
                                      sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]
        return f"px-{h}-u", f"px-{h}-a"

    def placed(self, text: str) -> dict:
        """The body to forward: the workspace as a system message before the first non-system one."""
        if not text:
            return self.body
        msgs = list(self.body["messages"])
        at = next((i for i, m in enumerate(msgs) if m["role"] not in LEADING_ROLES), len(msgs))
        msgs.insert(at, {"role": "system", "content": HEADER + text})
        return {**self.body, "messages": msgs}


class Proxy:
    """The route's state: the upstream client and the background appends in flight."""

    def __init__(self, ctx, upstream: Upstream):
        self.ctx, self.upstream = ctx, upstream
        self.tasks: set[asyncio.Task] = set()
        self.header_tokens: int | None = None

    async def model_tokens(self, text: str) -> int | None:
        """The placed message's length in the model's tokens (:data:`HEADER`'s, counted once, and
        ``text``'s), or None where the upstream does not count them; 0 for no text (nothing placed)."""
        if not text:
            return 0
        if self.header_tokens is None:
            self.header_tokens = await self.upstream.count_tokens(HEADER)
            if self.header_tokens is None:
                return None
        n = await self.upstream.count_tokens(text)
        return None if n is None else self.header_tokens + n

    async def workspace(self, req: ChatRequest, tenant, budget: int, t0: float) -> dict | None:
        """The workspace through the Backend's select (None: the bank does not exist yet)."""
        backend, cfg = self.ctx.backend, self.ctx.cfg
        if not await backend.has_bank(req.bank):
            return None
        q = req.question[-cfg.limits.max_question_chars:]
        try:
            r = SelectRequest(bank_id=req.bank, question=q, token_budget=budget)
        except ValueError as e:
            raise ProxyRefusal(400, f"the workspace request: {e}") from None
        try:
            item = self.ctx.item_of(r, t0, tenant=tenant)
        except HTTPError as e:
            field = req.budget_field or "token_budget"
            raise ProxyRefusal(400 if e.status == 422 else e.status, f"{field}: {e.detail}", field) from None
        (res,) = await backend.select([item], quota=tenant.quota(cfg))
        return res

    async def handle(self, request: Request):
        from .routes import _t0

        t0 = _t0(request)
        ctx, m = self.ctx, self.ctx.metrics
        try:
            tenant = await ctx.tenant_of_request(request)
        except HTTPError as e:
            return openai_error(e.status, e.detail, None, "authentication_error", "invalid_api_key", e.headers)
        try:
            req = ChatRequest(await request.body(), request.headers, tenant.token_budget or ctx.cfg.proxy_token_budget)
            if not tenant.owns(req.bank):
                raise ProxyRefusal(404, f"unknown bank id {req.bank!r}", "user", "unknown_bank")
            store = tenant.writable
            if store and not tenant.may_store(req.metadata):
                raise ProxyRefusal(403, f"{OWN_FIELD}.metadata: does not pass this API key's filter "
                                        f"{tenant.where.key} (the appended turns must); nothing was forwarded",
                                   f"{OWN_FIELD}.metadata")
            ws = await self.workspace(req, tenant, req.budget, t0)
            text, tokens = (ws["text"], ws["n_tokens"]) if ws else ("", 0)
            counted = await self.model_tokens(text)
            if counted is not None and counted > req.budget:  # in the model's tokens: select once more, smaller
                head = self.header_tokens
                smaller = max(1, math.floor((req.budget - head) * ws["n_tokens"] / max(1, counted - head)))
                ws = await self.workspace(req, tenant, smaller, t0)
                text = ws["text"]
                counted = await self.model_tokens(text)
            tokens = counted if counted is not None else tokens
        except ProxyRefusal as e:
            m.proxy_requests.labels("refused").inc()
            return e.response()
        m.proxy_workspace_tokens.observe(tokens)
        headers = {TOKENS_HEADER: str(tokens)}
        if ws is not None:
            headers["X-Trawmem-Workspace-Units"] = str(len(ws["units"]))

        def done(answer: str) -> None:
            if not store or not answer.strip():
                m.proxy_appends.labels("skipped").inc()
                return
            task = asyncio.get_running_loop().create_task(self.append(req, tenant, answer))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        send = self.upstream.stream if req.stream else self.upstream.forward
        return await send(req.placed(text), headers, done)

    async def append(self, req: ChatRequest, tenant, answer: str) -> None:
        """The user message and the answer appended as two turns (off the request path); a failure
        is logged and counted, never raised."""
        backend, m = self.ctx.backend, self.ctx.metrics
        uid, aid = req.turn_ids(answer)
        try:
            if await backend.has_bank(req.bank) and await backend.history(req.bank, uid, tenant.where) is not None:
                m.proxy_appends.labels("retry").inc()
                return
            meta = {"metadata": req.metadata} if req.metadata else {}
            batch = append_batch(None, [{"role": "user", "content": req.question, "id": uid, **meta},
                                        {"role": "assistant", "content": answer, "id": aid, **meta}], atomic=True)
            batch.scope = tenant.where
            await backend.append(req.bank, batch, quota=tenant.quota(self.ctx.cfg))
            m.proxy_appends.labels("stored").inc()
        except DuplicateTurns:  # the ids hash the exchange: held already, stored by a request just before
            m.proxy_appends.labels("retry").inc()
        except (TrawmemError, HTTPError, OSError, RuntimeError, ValueError) as e:
            m.proxy_appends.labels("failed").inc()
            log.warning("proxy: appending the exchange to bank %r failed: %s", req.bank, e)

    async def drain(self) -> None:
        """Wait for the appends in flight (the server's shutdown)."""
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        await self.upstream.aclose()


def add_proxy_routes(app: FastAPI, ctx) -> Proxy | None:
    """``POST /v1/chat/completions`` when the server has an upstream (``cfg.upstream``); the
    :class:`Proxy` (its :meth:`Proxy.drain` runs at shutdown), or None."""
    cfg = ctx.cfg
    if cfg.upstream is None:
        return None
    proxy = Proxy(ctx, Upstream(cfg.upstream, cfg.upstream_key_env, cfg.upstream_timeout_s, ctx.metrics))

    @app.post("/v1/chat/completions", tags=["proxy"],
              summary="OpenAI chat completions through the upstream, with a workspace placed in the messages")
    async def chat_completions(request: Request):
        return await proxy.handle(request)

    return proxy
