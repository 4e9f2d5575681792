"""LLM backend interface, result record, usage meter and the NoLLM backend."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from trawmem_gpu.errors import ConfigError, InputError, NoLLMConfigured, TrawmemError

Conversation = list  # list[dict(role, content)]
OnResult = Callable[[int, "LLMResult"], None]
Accept = Callable[[int, str], bool]
"""``accept(i, text)``: whether the reply to conversation ``i`` is usable (its parser reads it)."""

_ROLES = ("system", "user", "assistant")


class LLMRequestError(TrawmemError, RuntimeError):
    """An LLM request (or a whole batch) failed after all retries; the message never holds keys."""


@dataclass
class LLMResult:
    """One chat completion."""

    text: str
    """Generated text ('' when the request failed)."""
    prompt_tokens: int = 0
    """Prompt tokens as the server/engine reported them (0 when unknown)."""
    completion_tokens: int = 0
    """Completion tokens as the server/engine reported them (0 when unknown)."""
    latency_s: float = 0.0
    """Wall seconds of the successful attempt (0 for cache hits)."""
    cached: bool = False
    """True when the result came from the on-disk cache and no request was sent."""
    error: Optional[str] = None
    """Why the request failed after retries, or None on success."""
    finish_reason: Optional[str] = None
    """Why the model stopped: ``stop``, ``length`` (cut at ``max_tokens``: the reply is
    incomplete), ... (None when the server did not say)."""
    retries: int = 0
    """Attempts of this request beyond the first (transient failures, timeouts, interruptions)."""
    tokens_estimated: bool = False
    """True when the server reported no token counts and ``prompt_tokens`` / ``completion_tokens``
    are the client's own count (cl100k_base for the prompt, streamed chunks for the reply)."""

    @property
    def ok(self) -> bool:
        """True when the request succeeded."""
        return self.error is None

    @property
    def cut(self) -> bool:
        """True when the reply stopped at its token limit (``finish_reason == "length"``)."""
        return self.error is None and self.finish_reason == "length"

    def to_dict(self) -> dict:
        """Plain dict for result files."""
        return asdict(self)


@dataclass
class StageUsage:
    """Accumulated usage of one stage (one ``desc`` name)."""

    calls: int = 0
    """Results returned (cache hits included)."""
    requests: int = 0
    """Requests actually sent to the model (cache hits excluded)."""
    cached: int = 0
    """Results served from the cache."""
    errors: int = 0
    """Results that carry an error."""
    prompt_tokens: int = 0
    """Prompt tokens of the requests sent (cache hits excluded)."""
    completion_tokens: int = 0
    """Completion tokens of the requests sent (cache hits excluded)."""
    latency_s: float = 0.0
    """Sum of per-request latencies."""
    wall_s: float = 0.0
    """Wall seconds spent in ``chat`` calls of this stage."""
    batches: int = 0
    """Number of ``chat`` calls."""
    retries: int = 0
    """Attempts beyond the first of the requests sent (transient failures, timeouts), plus the
    follow-up requests that re-ask a malformed structured reply."""
    cut: int = 0
    """Replies that stopped at their token limit (``finish_reason == "length"``)."""
    replies: int = 0
    """Structured replies read (``llm.structured.ask``): the denominator of ``malformed``."""
    malformed: int = 0
    """Structured replies that could not be read as the JSON asked for (each reply counted; a
    reply cut at its token limit counts as ``cut`` instead)."""
    checked: int = 0
    """Outputs put to their checks (``llm.grounding``), each once: a structured reply that could be
    read, each fact read out of one, each free-text answer. The denominator of ``refused``: a
    reply holding ten facts counts one reply and ten facts checked."""
    refused: int = 0
    """Checked outputs refused by their checks (ungrounded, degenerate, markup, an answer that
    echoes the question or copies the workspace)."""
    fallbacks: int = 0
    """Items whose LLM output was not used: the caller fell back (extractive head, embedding
    segmentation, no fact, the question alone, an empty answer)."""


class UsageMeter:
    """Accumulates requests, tokens and latency per stage name."""

    def __init__(self) -> None:
        self.stages: dict[str, StageUsage] = {}

    def record(self, stage: str, results: Sequence[LLMResult], wall_s: float = 0.0) -> None:
        """Add one batch of results under ``stage``."""
        u = self.stages.setdefault(stage, StageUsage())
        u.batches += 1
        u.wall_s += float(wall_s)
        for r in results:
            u.calls += 1
            if r.error is not None:
                u.errors += 1
            u.cut += r.cut
            if r.cached:
                u.cached += 1
                continue
            u.requests += 1
            u.retries += int(r.retries or 0)
            u.prompt_tokens += int(r.prompt_tokens or 0)
            u.completion_tokens += int(r.completion_tokens or 0)
            u.latency_s += float(r.latency_s or 0.0)

    def note(self, stage: str, **counts: int) -> None:
        """Add ``counts`` (fields of :class:`StageUsage`: ``malformed=2, fallbacks=1``...) to ``stage``."""
        u = self.stages.setdefault(stage, StageUsage())
        for k, v in counts.items():
            if not isinstance(getattr(u, k, None), int):
                raise ValueError(f"UsageMeter.note: {k!r} is not a count of StageUsage")
            setattr(u, k, getattr(u, k) + int(v))

    def totals(self) -> dict:
        """All stages added up (:func:`usage_totals`)."""
        return usage_totals(self.summary())

    def summary(self) -> dict[str, dict]:
        """Per-stage usage as plain dicts (rounded seconds)."""
        out = {}
        for name, u in self.stages.items():
            d = asdict(u)
            d["latency_s"] = round(d["latency_s"], 4)
            d["wall_s"] = round(d["wall_s"], 4)
            out[name] = d
        return out

    def reset(self) -> None:
        """Forget all stages."""
        self.stages.clear()


USAGE_COUNTS = ("calls", "requests", "cached", "errors", "retries", "prompt_tokens", "completion_tokens", "cut",
                "replies", "malformed", "checked", "refused", "fallbacks")
"""The counts of :class:`StageUsage` that add up across stages (and across runs)."""


def usage_totals(stages: dict) -> dict:
    """The counts of a :meth:`UsageMeter.summary` (stage -> counts) added up over its stages, with
    the seconds (``seconds``: wall seconds of the calls) and the shares a user reads first:
    ``malformed_share`` of the structured replies read, ``refused_share`` of the outputs checked
    (None without one)."""
    out = {k: sum(int(s.get(k, 0)) for s in stages.values()) for k in USAGE_COUNTS}
    out["seconds"] = round(sum(float(s.get("wall_s", 0.0)) for s in stages.values()), 3)
    n = out["replies"]
    out["malformed_share"] = round(out["malformed"] / n, 4) if n else None
    c = out["checked"]
    out["refused_share"] = round(out["refused"] / c, 4) if c else None
    return out


def merge_usage(*summaries: dict) -> dict:
    """Several :meth:`UsageMeter.summary` dicts as one (a stage's counts and seconds added up)."""
    out: dict[str, dict] = {}
    for summ in summaries:
        for stage, u in (summ or {}).items():
            d = out.setdefault(stage, {})
            for k, v in u.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    d[k] = round(d.get(k, 0) + v, 4) if isinstance(v, float) else d.get(k, 0) + v
    return out


def validate_batch(batch) -> list[list[dict]]:
    """Check a batch of conversations; raise InputError naming the bad item."""
    if not isinstance(batch, (list, tuple)):
        raise InputError(f"chat batch must be a list of conversations, got {type(batch).__name__}")
    for i, conv in enumerate(batch):
        if not isinstance(conv, (list, tuple)) or not conv:
            raise InputError(f"chat batch item {i}: a conversation must be a non-empty list of messages")
        for j, m in enumerate(conv):
            if not isinstance(m, dict):
                raise InputError(f"chat batch item {i}, message {j}: must be a dict with role and content")
            if m.get("role") not in _ROLES:
                raise InputError(f"chat batch item {i}, message {j}: role must be one of {_ROLES}, got {m.get('role')!r}")
            if not isinstance(m.get("content"), str):
                raise InputError(f"chat batch item {i}, message {j}: content must be a string")
    return [list(c) for c in batch]


class LLMBackend:
    """Base class: ``chat`` validates, meters and delegates to ``_chat``.

    Subclasses set ``name`` and ``model`` and implement ``_chat``, which returns one
    :class:`LLMResult` per conversation, in order, and calls ``on_result(i, result)`` as each
    result becomes available (the cache uses it to commit per response).
    """

    name: str = "base"
    filters_replies: bool = False
    """True when ``_chat`` takes ``accept`` (the response cache: it keeps only accepted replies)."""
    takes_schema: bool = False
    """True when ``_chat`` takes ``schema`` (a JSON schema the server constrains decoding to)."""
    strict: bool = False
    """``--strict-llm``: any fallback from this backend's output is an error
    (:class:`~trawmem_gpu.errors.LLMFallbackError`) instead of a counted fallback."""

    def __init__(self) -> None:
        self.usage = UsageMeter()

    @property
    def model(self) -> Optional[str]:
        """Model id used in requests (and cache keys)."""
        return getattr(self, "_model", None)

    @property
    def endpoint(self) -> Optional[str]:
        """Who answers (part of the cache keys): an HTTP server's base URL, else the backend's name."""
        return self.name

    def chat(
        self,
        batch: list[list[dict]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_mode: bool = False,
        desc: Optional[str] = None,
        on_result: Optional[OnResult] = None,
        accept: Optional[Accept] = None,
        schema: Optional[dict] = None,
    ) -> list[LLMResult]:
        """Run one batch of conversations; results are in input order. ``accept(i, text)`` says
        whether a reply is usable (a structured call passes its parser): a response cache stores
        only accepted replies, and sends again a stored one that is not accepted. ``schema``: the
        JSON schema of the reply (with ``json_mode``), sent to backends that constrain decoding
        to it (``takes_schema``); others get JSON mode alone."""
        batch = validate_batch(batch)
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature!r}")
        if not batch:
            return []
        t0 = time.perf_counter()
        extra = {"accept": accept} if self.filters_replies else {}
        if self.takes_schema:
            extra["schema"] = schema if json_mode else None
        results = self._chat(
            batch, max_tokens=max_tokens, temperature=float(temperature),
            json_mode=bool(json_mode), desc=desc, on_result=on_result, **extra,
        )
        if len(results) != len(batch):  # pragma: no cover - backend bug guard
            raise LLMRequestError(f"{self.name}: got {len(results)} results for {len(batch)} conversations")
        self.usage.record(desc or "default", results, time.perf_counter() - t0)
        return results

    def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result) -> list[LLMResult]:
        raise NotImplementedError

    def schema_sent(self, schema: Optional[dict]) -> Optional[dict]:
        """The schema a request with ``schema`` goes out with (None: JSON mode alone): what a
        response cache keys on, so replies made with and without constraints never mix."""
        return schema if self.takes_schema else None

    def describe(self) -> dict:
        """Name and model for result files (never secrets)."""
        return {"backend": self.name, "model": self.model}

    def check(self) -> None:
        """Verify up front that requests can succeed (server reachable, key accepted, model
        served); raises ``ConfigError`` / ``LLMRequestError`` saying what is wrong. No-op here."""

    def close(self) -> None:
        """Release resources (no-op by default)."""


NO_LLM_MESSAGE = (
    "no LLM configured: give `answer_llm` / `judge_llm` (or the build's `llm`) as "
    "http://HOST:PORT/v1[@MODEL] for an OpenAI-compatible server or vllm:MODEL_PATH for "
    "offline vLLM"
)


class NoLLM(LLMBackend):
    """Backend that refuses every call with :class:`NoLLMConfigured`."""

    name = "none"

    def __init__(self, hint: Optional[str] = None) -> None:
        super().__init__()
        self.hint = hint
        """Extra text appended to the error (e.g. which step needed the LLM)."""

    @property
    def model(self) -> None:
        return None

    def chat(self, batch=None, *, max_tokens=0, temperature=0.0, json_mode=False, desc=None, on_result=None,
             accept=None, schema=None):
        """Always raises NoLLMConfigured."""
        msg = NO_LLM_MESSAGE
        if desc:
            msg += f" (needed for: {desc})"
        if self.hint:
            msg += f"; {self.hint}"
        raise NoLLMConfigured(msg)

    def __repr__(self) -> str:
        return "NoLLM()"


class Secret:
    """A string that never shows itself in repr/str/format."""

    __slots__ = ("_value",)

    def __init__(self, value: Optional[str]) -> None:
        self._value = value or None

    def reveal(self) -> Optional[str]:
        """The raw value (only for building request headers)."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret(None)"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self):  # refuse pickling the raw value
        return (Secret, (None,))

    def scrub(self, text: object) -> str:
        """``text`` with every occurrence of the secret replaced by '***'."""
        s = str(text)
        if self._value and self._value in s:
            s = s.replace(self._value, "***")
        return s


class FakeBackend(LLMBackend):
    """In-process backend answering through ``fn(conversation) -> text``; for tests and dry runs."""

    name = "fake"

    def __init__(self, fn: Callable[[list[dict]], str], model: str = "fake") -> None:
        super().__init__()
        self.fn = fn
        self._model = model
        self.requests = 0

    def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result):
        out = []
        for i, conv in enumerate(batch):
            self.requests += 1
            t0 = time.perf_counter()
            text = self.fn(conv)
            ptoks = sum(len(m["content"].split()) for m in conv)
            r = LLMResult(text, ptoks, len(text.split()), time.perf_counter() - t0)
            if on_result is not None:
                on_result(i, r)
            out.append(r)
        return out

    def __repr__(self) -> str:
        return f"FakeBackend(model={self._model!r})"


def usage_delta(before: dict, after: dict) -> dict:
    """The per-stage usage between two :meth:`UsageMeter.summary` snapshots (stages without any
    change left out)."""
    out = {}
    for stage, a in after.items():
        b = before.get(stage, {})
        d = {k: (round(v - b.get(k, 0.0), 4) if isinstance(v, float) else v - int(b.get(k, 0)))
             for k, v in a.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if any(d.values()):
            out[stage] = d
    return out


class LLMWork:
    """The LLM work done while a block runs, on ``backends`` (None skipped, each counted once)::

        with LLMWork(llm) as work:
            ...
        result["llm"] = work.report()   # None when no backend was given

    :meth:`report` gives ``{"totals": ..., "stages": ...}``: calls, requests sent, cache hits,
    retries, prompt and completion tokens, seconds, and the structured replies read, malformed,
    refused and fallen back (:func:`usage_totals`), in all and per stage.
    """

    def __init__(self, *backends) -> None:
        seen, self.backends = set(), []
        for b in backends:
            if b is not None and id(b) not in seen and hasattr(b, "usage"):
                seen.add(id(b))
                self.backends.append(b)
        self.stages: dict = {}

    def __enter__(self) -> "LLMWork":
        self._before = [b.usage.summary() for b in self.backends]
        return self

    def __exit__(self, *exc) -> None:
        self.stages = merge_usage(*(usage_delta(b0, b.usage.summary()) for b0, b in zip(self._before, self.backends)))

    def report(self) -> Optional[dict]:
        """Totals and stages of the block's work (None without a backend)."""
        if not self.backends:
            return None
        return {"totals": usage_totals(self.stages), "stages": self.stages}


def work_line(totals: dict) -> str:
    """One line on an LLM work total (:func:`usage_totals`) for a command's output."""
    t = totals
    line = (f"LLM work: {t['calls']} calls ({t['requests']} sent, {t['cached']} from the cache), {t['retries']} "
            f"retries, {t['prompt_tokens']:,} prompt + {t['completion_tokens']:,} completion tokens, "
            f"{t['seconds']:.1f}s")
    if t["replies"]:
        line += f"; structured replies: {t['replies']} read, {t['malformed']} malformed"
    if t.get("checked"):
        line += f"; outputs checked: {t['checked']}, {t['refused']} refused"
    if t["cut"]:
        line += f", {t['cut']} cut at the token limit"
    if t["errors"]:
        line += f"; {t['errors']} failed"
    return line + f"; {t['fallbacks']} fell back"
