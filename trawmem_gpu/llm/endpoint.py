"""What a client learns about an OpenAI-compatible endpoint while it talks to it.

One :class:`EndpointState` per server (base URL), shared by every backend that sends to it (an
answer and a judge backend on one server see one server): how many requests it serves at once,
how fast it reads prompts and writes replies, how long its context is, and which form of
constrained decoding it takes. Everything here is measured from replies, never assumed from a
server's name:

* **Concurrency.** With ``concurrency=None`` (``--llm-concurrency auto``) a batch starts with
  :data:`PROBE_CONCURRENCY` requests in flight. A streamed request whose first token arrives while
  another still has a while to stream proves the server works on several at once (up to
  :data:`MAX_AUTO_CONCURRENCY` then go); a stream cut short by the next request (llama.cpp's
  ``interrupt_requests``), or :data:`SERIAL_EVIDENCE` requests that were sent while another was
  in flight and began only once it had ended, prove it answers one at a time (then 1 goes). A
  server that cuts streams short gets plain requests from then on: another client's request
  would cut this one's stream as well (a stream that began before, and ends later, does not turn
  streaming back on). The limit holds for the whole process: every batch and backend that sends
  to the endpoint takes one of its places (:meth:`EndpointState.try_enter`), so two batches at
  once (threads, an answer and a judge backend) send one request at a time to a serial server.
* **Speed.** Prompt and generation tokens per second, running medians of the last replies
  (:data:`SPEED_WINDOW`); a request's time limit, when none is given, is derived from them, the
  prompt's size and its reply budget (:meth:`EndpointState.time_limit`).
* **Context.** The model's context in tokens: given, listed by ``GET /models`` (vLLM's
  ``max_model_len``, llama.cpp's ``n_ctx``), or read from the error of a prompt that overflowed it
  (llama.cpp and vLLM name it). Callers size their windows from it (:meth:`prompt_room`).
* **Constrained decoding.** Which ``response_format`` carries a JSON schema here: OpenAI's
  ``json_schema`` (vLLM, llama.cpp's server, OpenAI), llama-cpp-python's ``json_object`` with a
  ``schema`` (its server refuses the other form), or none (plain JSON mode; reported once).
"""
from __future__ import annotations

import logging
import re
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

log = logging.getLogger(__name__)

PROBE_CONCURRENCY = 2
"""Requests in flight while the endpoint's concurrency is unknown."""
MAX_AUTO_CONCURRENCY = 16
"""Requests in flight once the endpoint is seen to serve several at once."""
SERIAL_EVIDENCE = 2
"""Overlapping requests served strictly one after the other that prove a serial server."""
SERIAL_WAIT_S = 0.3
"""A request counts as queued behind others only when it waited this long for them."""
SERIAL_SLACK_S = 0.1
"""How much earlier than the others' end (as this client saw it) a queued request's first token
may be seen: the last chunk of one reply and the first of the next cross in the client's loop."""
SPEED_WINDOW = 16
"""Replies whose speeds the running medians keep."""
DEFAULT_PROMPT_TPS = 20.0
"""Prompt tokens per second assumed before any reply was measured (a slow local CPU model)."""
DEFAULT_GEN_TPS = 10.0
"""Reply tokens per second assumed before any reply was measured: a 2,048-token reply fits in
the derived limit with room to spare on a 30 tokens/s model."""
SAFETY = 3.0
"""A derived time limit allows this many times the time the measured speeds predict."""
BASE_S = 30.0
"""A derived time limit's fixed part (connection, scheduling, a busy machine)."""
CHARS_PER_TOKEN = 3.0
"""Prompt characters per token for a first estimate (on the safe side of English text)."""

SCHEMA_FORMS = ("json_schema", "json_object_schema", "json")
"""The ways of asking for a schema, tried in this order until the endpoint takes one."""

_CTX_RE = re.compile(r"(?:maximum context length is|context window of|context length of|n_ctx[ =:]+)\s*(\d+)",
                     re.IGNORECASE)
_CONSTRAINT_RE = re.compile(r"response_format|json_schema|json_object|grammar|guided|structured", re.IGNORECASE)


def context_from_error(text: str) -> Optional[int]:
    """The model's context length named by an overflow error (llama.cpp, vLLM, OpenAI), or None."""
    m = _CTX_RE.search(text or "")
    return int(m.group(1)) if m else None


def is_context_error(text: str) -> bool:
    """True when an HTTP error body says the prompt (and reply budget) overflow the context."""
    low = (text or "").lower()
    return "context_length_exceeded" in low or context_from_error(low) is not None or "context length" in low


def is_constraint_error(text: str) -> bool:
    """True when an HTTP 400/422 body names the request's ``response_format`` (JSON mode or schema)."""
    return bool(_CONSTRAINT_RE.search(text or "")) and not is_context_error(text)


def estimate_tokens(messages: list[dict]) -> int:
    """A first estimate of a conversation's prompt tokens (characters / CHARS_PER_TOKEN, plus the
    chat template's few tokens per message)."""
    return int(sum(len(m.get("content", "")) for m in messages) / CHARS_PER_TOKEN) + 8 * len(messages)


@dataclass
class EndpointState:
    """What is known about one endpoint (module docstring); thread-safe."""

    url: str
    limit: Optional[int] = None
    """Requests in flight (None: still probing)."""
    serial: Optional[bool] = None
    """True: one request at a time; False: several; None: not known yet."""
    context_tokens: Optional[int] = None
    """The model's context in tokens (None: not known)."""
    streams: Optional[bool] = None
    """Whether the endpoint streams when asked (None: not asked yet)."""
    schema_form: Optional[str] = None
    """The ``SCHEMA_FORMS`` entry the endpoint took (None: not asked yet)."""
    schema_refusal: Optional[str] = None
    """Why the endpoint refused schemas (its error, cut), when it did."""
    token_ratio: Optional[float] = None
    """Server prompt tokens per :func:`estimate_tokens` token (learned from reported usage)."""
    _prompt_tps: deque = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))
    _gen_tps: deque = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))
    _flights: dict = field(default_factory=dict)
    """Request id -> [sent, first token, ended, the requests open when it was sent] (monotonic
    seconds; the latest 256), for the concurrency evidence."""
    _serial_seen: int = 0
    _busy: int = 0
    """Requests of this process in flight to the endpoint (every batch and backend together)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- concurrency ----------------------------------------------------------------------------
    def in_flight_limit(self, configured: Optional[int]) -> int:
        """Requests a batch may have in flight: ``configured`` when given, else what was learned."""
        if configured is not None:
            return int(configured)
        if self.serial is True:
            return 1
        if self.serial is False:
            return MAX_AUTO_CONCURRENCY
        return PROBE_CONCURRENCY

    def try_enter(self, configured: Optional[int]) -> Optional[int]:
        """Take one of the endpoint's places in flight when fewer than :meth:`in_flight_limit` of
        this process's requests are (whichever batch or backend sent them); returns how many others
        are in flight, or None (full: try again later). Every place taken is given back by
        :meth:`leave`."""
        with self._lock:
            if self._busy >= self.in_flight_limit(configured):
                return None
            self._busy += 1
            return self._busy - 1

    def leave(self) -> None:
        """A request that :meth:`try_enter` let in ended (answered, failed or abandoned)."""
        with self._lock:
            self._busy = max(0, self._busy - 1)

    def saw_stream(self) -> None:
        """A reply came as a stream: the endpoint streams, unless it was seen to cut streams short
        (:meth:`interrupted`): a stream sent before that, answered after, changes nothing."""
        with self._lock:
            if self.streams is None:
                self.streams = True

    def started(self, rid: int, others_in_flight: int = 0) -> None:
        """Request ``rid`` was sent (the requests then in flight are noted with it)."""
        with self._lock:
            now = time.monotonic()
            open_ = {k for k, f in self._flights.items() if f[2] is None}
            self._flights[rid] = [now, None, None, open_]
            while len(self._flights) > 256:
                self._flights.pop(next(iter(self._flights)))

    def first_token(self, rid: int) -> None:
        """Request ``rid``'s first token came."""
        with self._lock:
            f = self._flights.get(rid)
            if f is not None:
                f[1] = time.monotonic()

    def finished(self, rid: int, streamed: bool) -> None:
        """Request ``rid`` ended. Another request that began generating while this one still had
        :data:`SERIAL_WAIT_S` to go proves that the server serves several at once. A streamed one
        sent while others ran, whose first token came only once they had all ended, and that
        waited at least :data:`SERIAL_WAIT_S` for them, counts as evidence of a server that
        answers one at a time (a fast reply proves neither)."""
        with self._lock:
            f = self._flights.get(rid)
            if f is None:
                return
            f[2] = time.monotonic()
            if not streamed or f[1] is None or self.serial is not None:
                return
            if any(k != rid and g[1] is not None and f[1] < g[1] < f[2] - SERIAL_WAIT_S
                   for k, g in self._flights.items()):
                # another request started generating while this one still had a while to go
                self.serial = False
                log.info("%s serves several requests at once; up to %d in flight", self.url, MAX_AUTO_CONCURRENCY)
                return
            ends = [self._flights[k][2] for k in f[3] if k in self._flights]
            if ends and all(e is not None for e in ends):
                last = max(ends)
                if f[1] >= last - SERIAL_SLACK_S and last - f[0] >= SERIAL_WAIT_S:
                    self._serial_seen += 1
                    if self._serial_seen >= SERIAL_EVIDENCE:
                        self._mark_serial("requests sent together were served one after the other")

    def interrupted(self) -> None:
        """A stream was cut short by another request: the server answers one at a time, and it
        stops a streaming request whenever another arrives (llama-cpp-python's
        ``interrupt_requests``), from this client or any other. Streams would cancel each other
        without end, so requests go plain from now on (not cancellable: a timed-out one is waited
        for, never sent twice)."""
        with self._lock:
            self._mark_serial("a new request interrupted a streaming one")
            if self.streams is not False:
                self.streams = False
                log.warning("%s stops a streaming request when another arrives: sending plain requests", self.url)

    def _mark_serial(self, why: str) -> None:
        if self.serial is not True:
            self.serial = True
            log.warning("%s answers one request at a time (%s): sending one at a time "
                        "(set --llm-concurrency to override)", self.url, why)

    # -- speed and time limits --------------------------------------------------------------------
    def observe(self, prompt_tokens: int, completion_tokens: int, first_token_s: Optional[float],
                total_s: float, estimated_prompt: int) -> None:
        """Record one reply's speeds (``first_token_s``: time to its first token, streamed only)."""
        with self._lock:
            if prompt_tokens and estimated_prompt:
                r = prompt_tokens / estimated_prompt
                self.token_ratio = r if self.token_ratio is None else 0.8 * self.token_ratio + 0.2 * r
            if first_token_s and prompt_tokens and first_token_s > 0.05:
                self._prompt_tps.append(prompt_tokens / first_token_s)
            gen_s = total_s - (first_token_s or 0.0)
            if completion_tokens > 4 and gen_s > 0.05:
                self._gen_tps.append(completion_tokens / gen_s)

    def speeds(self) -> tuple[float, float]:
        """(prompt, generation) tokens per second: the running medians, or the defaults."""
        with self._lock:
            p = statistics.median(self._prompt_tps) if self._prompt_tps else DEFAULT_PROMPT_TPS
            g = statistics.median(self._gen_tps) if self._gen_tps else DEFAULT_GEN_TPS
        return p, g

    def prompt_tokens(self, messages: list[dict]) -> int:
        """The prompt's tokens as this server counts them, estimated (on the safe side)."""
        est = estimate_tokens(messages)
        return int(est * max(1.0, self.token_ratio or 1.0))

    def time_limit(self, prompt_tokens: int, max_tokens: int) -> float:
        """Seconds a request may take when no limit is given: ``BASE_S`` plus ``SAFETY`` times
        what the measured speeds predict for its prompt and its whole reply budget."""
        p, g = self.speeds()
        return BASE_S + SAFETY * (prompt_tokens / max(p, 1e-3) + max_tokens / max(g, 1e-3))

    # -- context ----------------------------------------------------------------------------------
    def learn_context(self, n: Optional[int], source: str) -> None:
        """Record the model's context length (from ``source``: models list, an overflow error...)."""
        if n and n > 0 and n != self.context_tokens:
            with self._lock:
                self.context_tokens = int(n)
            log.info("%s: the model's context is %d tokens (%s)", self.url, n, source)

    def prompt_room(self, max_tokens: int) -> Optional[int]:
        """Prompt tokens that fit beside a ``max_tokens`` reply (None: context unknown)."""
        if not self.context_tokens:
            return None
        return max(0, self.context_tokens - int(max_tokens) - 16)

    # -- constrained decoding -----------------------------------------------------------------------
    def refuse_form(self, form: str, why: str) -> None:
        """The endpoint refused ``form``: use the next one (reported once, when schemas are out)."""
        with self._lock:
            i = SCHEMA_FORMS.index(form)
            if self.schema_form is not None and SCHEMA_FORMS.index(self.schema_form) > i:
                return  # another request learned it already
            log.info("%s refused the %s form of a JSON schema; trying the next", self.url, form)
            self.schema_form = SCHEMA_FORMS[min(i + 1, len(SCHEMA_FORMS) - 1)]
            if self.schema_form == "json":
                self.schema_refusal = " ".join(str(why).split("  File ")[0].split())[:240]
                log.warning("%s does not take JSON schemas (%s); structured calls use plain JSON mode",
                            self.url, self.schema_refusal)

    def describe(self) -> dict:
        """What was learned, for result files."""
        p, g = self.speeds()
        return {"serial": self.serial, "context_tokens": self.context_tokens, "schema_form": self.schema_form,
                "schema_refusal": self.schema_refusal, "prompt_tps": round(p, 1), "gen_tps": round(g, 1)}


_STATES: dict[str, EndpointState] = {}
_STATES_LOCK = threading.Lock()


def endpoint_state(url: str) -> EndpointState:
    """The one state of the endpoint at ``url`` in this process."""
    with _STATES_LOCK:
        st = _STATES.get(url)
        if st is None:
            st = _STATES[url] = EndpointState(url)
        return st


def forget_endpoints() -> None:
    """Drop every learned state (tests; a server restarted with another model)."""
    with _STATES_LOCK:
        _STATES.clear()
