"""The client's results: dataclasses, field for field the server's response models
(``serve/models.py``); keys a newer server adds are ignored."""
from __future__ import annotations

from dataclasses import dataclass, field, fields


def _from(cls, d: dict):
    """``cls`` from the keys of ``d`` it declares (others ignored: a newer server may add some)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Unit:
    """One selected turn."""

    id: str
    speaker: str
    date: str | None
    timestamp: str
    text: str
    caption: str | None
    thread: int
    session: int


@dataclass(frozen=True)
class ThreadHead:
    thread: int
    head: str | None


@dataclass(frozen=True)
class Timings:
    """Where a request's time went inside the server (milliseconds)."""

    queue_ms: float | None
    encode_ms: float
    select_ms: float
    assemble_ms: float
    batch_size: int
    total_ms: float | None = None


@dataclass(frozen=True)
class SelectResult:
    """The workspace for one question (``POST /v1/select``)."""

    bank_id: str
    bank_n_units: int
    question: str
    budget: int | None
    hops: int
    token_budget: int | None
    date: str | None
    date_used: bool
    units: tuple[Unit, ...]
    threads: tuple[ThreadHead, ...]
    text: str
    n_tokens: int
    tokenizer: str
    timings: Timings | None = None

    @property
    def tokens(self) -> int:
        """``n_tokens``: the rendered workspace's tokens (as ``Memory``'s ``Workspace.tokens``)."""
        return self.n_tokens

    @property
    def unit_ids(self) -> list[str]:
        return [u.id for u in self.units]

    @classmethod
    def from_json(cls, d: dict) -> "SelectResult":
        t = d.get("timings")
        return _from(cls, {**d, "units": tuple(_from(Unit, u) for u in d.get("units", ())),
                           "threads": tuple(_from(ThreadHead, t) for t in d.get("threads", ())),
                           "timings": _from(Timings, t) if isinstance(t, dict) else None})


@dataclass(frozen=True)
class BankSummary:
    bank_id: str
    n_units: int
    n_threads: int


@dataclass(frozen=True)
class BankList:
    """``GET /v1/banks``: the banks this key can see, and the collection's encoder."""

    banks: tuple[BankSummary, ...]
    encoder: str | None
    dim: int

    @classmethod
    def from_json(cls, d: dict) -> "BankList":
        return _from(cls, {**d, "banks": tuple(_from(BankSummary, b) for b in d.get("banks", ()))})


@dataclass(frozen=True)
class BankInfo:
    """``GET /v1/banks/{bank_id}``."""

    bank_id: str
    n_units: int
    n_threads: int
    n_sessions: int
    first_date: str | None
    last_date: str | None


@dataclass(frozen=True)
class AppendResult(BankInfo):
    """``POST /v1/banks/{bank_id}/turns``: the bank after the append (its :class:`BankInfo`), and
    what the append did."""

    created: bool
    appended: int
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ForgetResult:
    """A forget's answer (``DELETE /v1/banks/{bank_id}`` or ``POST /v1/banks/{bank_id}/forget``,
    as ``Memory.forget`` returns it): the turn ids ``forgotten``, those the bank did not hold
    (``missing``), whether the whole bank is gone (``deleted``), the bank's ``n_units`` after it,
    and how many cache rows and ``score`` output records were erased."""

    bank_id: str
    forgotten: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    deleted: bool = False
    n_units: int = 0
    cache_rows: int = 0
    output_records: int = 0

    @classmethod
    def from_json(cls, d: dict) -> "ForgetResult":
        return _from(cls, {**d, "forgotten": tuple(d.get("forgotten") or ()), "missing": tuple(d.get("missing") or ())})
