"""A tiny OpenAI-compatible chat server on 127.0.0.1 for tests (stdlib only, threaded).

Replies are deterministic functions of the prompt: segmentation prompts get a boundary every
3 turns, head prompts a JSON head (its thread's first 12 words), judge prompts CORRECT when the gold text appears in the
generated answer, answer prompts the phrase after "the answer is" in the memory. Knobs make it
fail the first N requests, delay replies, return malformed JSON, answer through a test's own
``responders``, and it records request
counts, the peak number of requests in flight and the Authorization headers it saw.

It speaks the parts of the protocol a real server's behaviour depends on, as llama.cpp's
OpenAI-compatible server (llama-cpp-python) does: a reply is cut at ``max_tokens`` words
(``finish_reason: "length"``); ``stream: true`` gets server-sent events, one word a chunk, and a
client that closes its stream stops the reply (``cancelled`` counts them); ``serial`` serves one
request at a time and, with ``interrupt``, a streaming reply ends early when the next request
arrives; ``context_words`` refuses longer prompts with llama.cpp's overflow error;
``schema_forms`` lists the ``response_format`` forms it takes (others get llama-cpp-python's answer
to OpenAI's ``json_schema``: HTTP 500 with a validation error naming ``response_format``).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

MALFORMED_ALWAYS = "MALFORMED_ALWAYS"
"""Prompts containing this always get malformed JSON."""
MALFORMED_ONCE = "MALFORMED_ONCE"
"""Prompts containing this get malformed JSON unless the conversation is a retry (>1 user message)."""


class LLMServer:
    """Start with ``start()``, stop with ``stop()``; ``base_url`` ends in ``/v1``."""

    def __init__(self, models: tuple = ("test-model-a", "test-model-b")) -> None:
        self.models = list(models)
        self.fail_first = 0
        """Fail this many chat requests (counted from now) with ``fail_status``."""
        self.fail_status = 500
        self.retry_after: Optional[str] = None
        """Retry-After header value sent with failures."""
        self.echo_auth_in_errors = False
        """Put the Authorization header into failure bodies (tests key masking)."""
        self.delay_s = 0.0
        """Sleep this long before answering each chat request."""
        self.hang = False
        """When true, chat requests get no reply: the connection closes at ``stop()`` or after
        300 s (a server that never answers: a client's timeout fires however slow the machine is,
        and a client without one fails with a closed connection, not a timeout)."""
        self.gate_at = 0
        """When > 0, hold every chat request until this many are in flight at once (then the gate
        stays open; at most 60 s), so a concurrency bound is reached whatever the machine's speed."""
        self.required_key: Optional[str] = None
        """When set, every request without ``Authorization: Bearer <required_key>`` gets HTTP 401."""
        self.responders: list = []
        """Functions ``messages -> reply text or None`` asked first, in order (a test's own
        replies for prompts the built-in rules do not know); None passes to the next rule."""
        self.streams = True
        """Answer ``stream: true`` with server-sent events (False: a plain JSON body, as a server
        that ignores ``stream``)."""
        self.stream_usage = True
        """Send a usage chunk at the end of a stream that asks for one (``stream_options``), as
        OpenAI and vLLM do; False: none, as llama-cpp-python (the client then counts itself)."""
        self.serial = False
        """Serve one chat request at a time (the others wait, as llama.cpp's server makes them)."""
        self.interrupt = False
        """With ``serial``: a streaming reply ends early (``[DONE]``, no finish reason) when another
        request is waiting (llama-cpp-python's ``interrupt_requests``)."""
        self.word_delay_s = 0.0
        """Seconds per streamed word (a slow model), checked against a closed connection."""
        self.context_words = 0
        """When > 0, a prompt of more words gets llama.cpp's context-overflow error (HTTP 400)."""
        self.schema_forms = ("json_schema", "json_object_schema", "json_object")
        """The ``response_format`` forms taken; another gets HTTP 500 naming ``response_format``."""
        self.cancelled = 0
        """Streamed replies whose client closed the stream before the end."""
        self.interrupted = 0
        """Streamed replies cut short by a waiting request (``interrupt``)."""
        self._serve_lock = threading.Lock()
        self._waiting = 0
        self.lock = threading.Lock()
        self.seen = threading.Condition(self.lock)
        """Notified whenever a chat request is counted (see ``wait_requests``)."""
        self._released = threading.Event()
        self._gate_open = threading.Event()
        self.requests = 0
        self.model_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.auth_headers: list[Optional[str]] = []
        self.bodies: list[dict] = []
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "LLMServer":
        from trawmem_gpu.llm.endpoint import forget_endpoints

        forget_endpoints()  # what a client learned of an earlier server on this port does not carry over
        state = self

        class Handler(_Handler):
            server_state = state

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        srv.request_queue_size = 128
        self._server = srv
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()  # hung requests end (their clients left long ago)
        self._gate_open.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_requests(self, n: int, limit_s: float = 120.0) -> int:
        """Wait until ``n`` chat requests were counted (a client that timed out may leave before
        the server reads its request); returns the count, which the caller asserts on."""
        with self.seen:
            self.seen.wait_for(lambda: self.requests >= n, timeout=limit_s)
            return self.requests

    def reset_counts(self) -> None:
        with self.lock:
            self.requests = self.model_requests = self.max_in_flight = self.cancelled = self.interrupted = 0
            self.auth_headers.clear()
            self.bodies.clear()

    # -- replies ----------------------------------------------------------------------------
    @staticmethod
    def reply_for(messages: list[dict]) -> str:
        """Deterministic reply text for a conversation."""
        users = [m.get("content", "") for m in messages if m.get("role") == "user"]
        first = users[0] if users else ""
        if MALFORMED_ALWAYS in first or (MALFORMED_ONCE in first and len(users) == 1):
            return 'Sure, here it is: {"boundaries": [0, 2, "head": oops'
        if '"boundaries"' in first:
            n = len(re.findall(r"^\[\d+\]", first, flags=re.MULTILINE))
            return json.dumps({"boundaries": list(range(0, n, 3))})
        if '{"head"' in first:
            m = re.search(r"Thread:\n(.*?)\n\nReply", first, flags=re.DOTALL)
            thread = re.sub(r"\[[^\]]*\]\s*", "", m.group(1) if m else first)  # timestamps out
            return "```json\n" + json.dumps({"head": "Summary: " + " ".join(thread.split()[:12])}) + "\n```"
        if '"label"' in first:
            g = re.search(r"^Gold answer: (.*)$", first, flags=re.MULTILINE)
            p = re.search(r"^Generated answer: (.*)$", first, flags=re.MULTILINE)
            gold = g.group(1).strip().lower() if g else ""
            pred = p.group(1).strip().lower() if p else ""
            return json.dumps({"label": "CORRECT" if gold and gold in pred else "WRONG"})
        if "Question:" in first:
            m = re.search(r"the answer is ([^.\n]+)", first, flags=re.IGNORECASE)
            return m.group(1).strip() if m else "Not mentioned in the conversation."
        return "echo " + hashlib.sha256(first.encode()).hexdigest()[:8]


class _Handler(BaseHTTPRequestHandler):
    server_state: LLMServer
    protocol_version = "HTTP/1.0"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _send(self, status: int, payload, headers: Optional[dict] = None) -> None:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):  # client timed out and left
            pass

    def _refused(self) -> bool:
        st = self.server_state
        if st.required_key is not None and self.headers.get("Authorization") != f"Bearer {st.required_key}":
            self._send(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
            return True
        return False

    def do_GET(self) -> None:
        st = self.server_state
        if self.path.rstrip("/") == "/v1/models":
            if self._refused():
                return
            with st.lock:
                st.model_requests += 1
                st.auth_headers.append(self.headers.get("Authorization"))
            self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in st.models]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        st = self.server_state
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "bad json"}})
            return
        auth = self.headers.get("Authorization")
        if self._refused():
            return
        with st.lock:
            st.requests += 1
            st.auth_headers.append(auth)
            st.bodies.append(body)
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            fail = st.fail_first > 0
            if fail:
                st.fail_first -= 1
            if st.gate_at and st.in_flight >= st.gate_at:
                st._gate_open.set()
            st.seen.notify_all()
        held = False
        if st.serial:
            with st.lock:
                st._waiting += 1
            st._serve_lock.acquire()
            held = True
            with st.lock:
                st._waiting -= 1
        try:
            if st.gate_at:
                st._gate_open.wait(60)
            if st.hang:
                st._released.wait(300)
                return
            if st.delay_s:
                time.sleep(st.delay_s)
            if fail:
                msg = "transient failure"
                if st.echo_auth_in_errors:
                    msg += f" (auth was {auth})"
                headers = {"Retry-After": st.retry_after} if st.retry_after is not None else None
                self._send(st.fail_status, {"error": {"message": msg}}, headers)
                return
            refused = _format_refusal(body, st)
            if refused:
                self._send(500 if refused.startswith("1 validation") else 400, {"error": {"message": refused}})
                return
            messages = body.get("messages") or []
            words = sum(len(str(m.get("content", "")).split()) for m in messages)
            if st.context_words and words > st.context_words:
                self._send(400, {"error": {
                    "message": f"This model's maximum context length is {st.context_words} tokens, however you "
                               f"requested {words + int(body.get('max_tokens') or 0)} tokens ({words} in the messages, "
                               f"{body.get('max_tokens')} in the completion). Please reduce the length.",
                    "type": "invalid_request_error", "code": "context_length_exceeded"}})
                return
            text = next((r for f in list(st.responders) if (r := f(messages)) is not None), None)
            if text is None:
                text = LLMServer.reply_for(messages)
            text, finish = _cut(text, body.get("max_tokens"))
            if body.get("stream") and st.streams:
                usage = {"prompt_tokens": words, "completion_tokens": len(text.split()),
                         "total_tokens": words + len(text.split())} \
                    if st.stream_usage and (body.get("stream_options") or {}).get("include_usage") else None
                self._stream(text, finish, st, usage)
                return
            self._send(200, {
                "id": "chatcmpl-test", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": {"prompt_tokens": words, "completion_tokens": len(text.split()),
                          "total_tokens": words + len(text.split())},
            })
        finally:
            if held:
                st._serve_lock.release()
            with st.lock:
                st.in_flight -= 1

    def _stream(self, text: str, finish: str, st: "LLMServer", usage: Optional[dict] = None) -> None:
        """Server-sent events, one word a chunk (a closed connection or a waiting request, with
        ``interrupt``, ends it early)."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            words = text.split(" ")
            first = {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
            self.wfile.write(b"data: " + json.dumps(first).encode() + b"\n\n")
            for k, w in enumerate(words):
                if st.word_delay_s:
                    time.sleep(st.word_delay_s)
                if st.serial and st.interrupt and st._waiting:
                    with st.lock:
                        st.interrupted += 1
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                piece = w if k == 0 else " " + w
                ev = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                self.wfile.flush()
            last = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
            if usage is not None:
                self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            with st.lock:
                st.cancelled += 1


def _cut(text: str, max_tokens) -> tuple[str, str]:
    """``text`` cut at ``max_tokens`` words, and the finish reason (``length`` when cut)."""
    words = text.split(" ")
    if isinstance(max_tokens, int) and 0 < max_tokens < len([w for w in words if w]):
        return " ".join(words[:max_tokens]), "length"
    return text, "stop"


def _format_refusal(body: dict, st: "LLMServer") -> Optional[str]:
    """Why the server refuses the request's ``response_format`` (None: it takes it)."""
    rf = body.get("response_format")
    if not rf:
        return None
    form = "json_schema" if rf.get("type") == "json_schema" else \
        "json_object_schema" if rf.get("type") == "json_object" and "schema" in rf else \
        "json_object" if rf.get("type") == "json_object" else str(rf.get("type"))
    if form in st.schema_forms:
        return None
    if form == "json_object":
        return "bad request: response_format (JSON mode) is not supported by this server"
    return ("1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
            f"'msg': \"Input should be 'text' or 'json_object'\", 'input': '{form}'}}")


def http_backend(server: "LLMServer", **kw):
    """An ``OpenAIHTTPBackend`` on ``server`` as the tests use it: model ``m``, short backoff, no
    progress bar (``kw`` overrides any of them, and adds the rest)."""
    from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend

    kw.setdefault("model", "m")
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("progress", False)
    return OpenAIHTTPBackend(server.base_url, **kw)


def user_turn(text: str) -> list[dict]:
    """A conversation of one user message."""
    return [{"role": "user", "content": text}]
