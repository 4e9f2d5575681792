"""The one interface the HTTP routes are written against: :class:`Backend`.

Three classes implement it, and the app (``app.create_app``) takes any of them:

* :class:`LocalBackend`: one process, a thin async adapter over a
  :class:`~.service.SelectionService` (``trawmem serve``);
* :class:`~.remote.RemoteBackend`: a front process of ``--http-workers N``, each call forwarded
  to the engine process over the socket of :mod:`.wire`, where an :class:`~.remote.EngineEndpoint`
  answers it with a :class:`LocalBackend` (the calls are :data:`CALLS`, one table);
* :class:`~.ray_app.RayBackend`: the Ray Serve router, each call sent to its bank's shard.

Every call is a coroutine (the routes ``await`` each one, whichever backend answers). The
answers are the wire models' JSON data (:mod:`.models`; the annotations name the model), which
the routes send as they are, without building the pydantic objects again. Besides the calls, a
backend shows its state as attributes: ``ready``, ``dim``, ``encoder_id``, ``defaults``, and
``queue_depth()``, the one plain method: Prometheus reads it from its collector, which cannot await.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Protocol

from .models import (AppendResponse, BankInfo, BankSummary, ForgetResponse, HistoryEvent, ImportResponse,
                     SelectResponse)

if TYPE_CHECKING:
    from ..data.filters import Filter
    from ..memory.turns import AppendBatch
    from ..select.params import QueryParams
    from .keys import Quota
    from .service import SelectionService, SelectItem

# The answers, as the JSON data of their wire model (the routes send them as they are).
Workspace = Annotated[dict, SelectResponse]
Appended = Annotated[dict, AppendResponse]
Forgotten = Annotated[dict, ForgetResponse]
BankRow = Annotated[dict, BankSummary]
BankCounts = Annotated[dict, BankInfo]
Event = Annotated[dict, HistoryEvent]
Imported = Annotated[dict, ImportResponse]
Pieces = "AsyncIterator[bytes] | bytes"
"""An export: its pieces as they are made (in the process holding the bank), or its bytes."""
Lines = "AsyncIterator[bytes] | bytes"
"""An import's body: its lines as they arrive (``serve.portable.body_lines``), or its bytes."""


class Backend(Protocol):
    """What the routes need from whatever answers them (module docstring). A bank that does not
    exist is ``UnknownBank`` (or None where the answer says so), a quarantined one
    ``QuarantinedBank``; a full queue ``QueueFull``, a missed deadline ``DeadlineExceeded``, a
    server going down ``ShuttingDown``: the app's exception handlers turn each into its status."""

    ready: bool
    """Warmed up and not draining (``/readyz``)."""
    dim: int
    """The collection's encoder dimension (a ``question_vector``'s length)."""
    encoder_id: str | None
    defaults: QueryParams
    """The server's query parameters, under a request's own (``select.params.merge_params``)."""

    def queue_depth(self) -> int:
        """Queries waiting for a batch (a gauge; 0 where the queues live elsewhere)."""

    async def start(self) -> None:
        """Before the first request (the app's lifespan)."""

    async def stop(self) -> None:
        """Drain: answer what is in flight, refuse new work."""

    async def select(self, items: list[SelectItem], batch: bool = False,
                     quota: Quota | None = None) -> list[Workspace]:
        """One workspace per item, in order (``batch``: a bank error names ``requests[i]``);
        ``quota``: the key's limits of queued queries and share of a batch."""

    async def append(self, bank_id: str, batch: AppendBatch, quota: Quota | None = None) -> Appended:
        """Append ``batch``'s items (the first append creates the bank), answered per item."""

    async def forget(self, bank_id: str, turn_ids: list[str] | None, where: Filter | None = None) -> Forgotten:
        """Forget turns (None: the whole bank); ``where``: a bound key's filter (turns outside it are missing)."""

    async def has_bank(self, bank_id: str) -> bool:
        """Whether the bank is served (quarantined: False)."""

    async def bank_list(self) -> list[BankRow]:
        """Every bank's row; a quarantined one's names why (``quarantined``)."""

    async def bank_info(self, bank_id: str, where: Filter | None = None) -> BankCounts | None:
        """A bank's counts as ``where`` sees them (None: no such bank)."""

    async def history(self, bank_id: str, unit_id: str, where: Filter | None = None) -> list[Event] | None:
        """A unit's events, oldest first (None: no such unit and no history of one)."""

    async def export_bank(self, bank_id: str, where: Filter | None = None, vectors: bool = False) -> Pieces:
        """The bank as an export (JSON Lines, ``docs/export.md``: header and the bank): an async
        iterator of its pieces, made from one revision of the bank as they are sent, or (from across
        a process) its bytes; ``where``: a bound key's filter (only turns passing it, facts whose
        sources all pass, no history); ``vectors``: with each unit's vector. ``UnknownBank`` before
        any piece."""

    async def import_bank(self, bank_id: str, body: Lines, where: Filter | None = None,
                          quota: Quota | None = None) -> Imported:
        """Import ``body`` (an export of bank ``bank_id`` alone: an async iterator of its byte lines,
        read as the import takes them, or its bytes) into it, answered per item; ``where``: a bound
        key's filter (turns outside it refused); ``InputError`` naming the line and field."""

    async def metrics_text(self) -> bytes:
        """Prometheus text of families the app's own registry does not hold (the engine
        process's, under ``--http-workers``); empty elsewhere."""


LIFECYCLE = ("start", "stop")
CALLS = tuple(name for name, fn in vars(Backend).items()
              if inspect.iscoroutinefunction(fn) and name not in LIFECYCLE)
"""The backend's calls (its coroutines but the lifecycle): what a front forwards to the engine
process (``remote``), by name, in this one table."""


class LocalBackend:
    """:class:`Backend` in one process: each call the :class:`~.service.SelectionService`'s own,
    awaited where it is a coroutine. ``metrics``: the registry whose text :meth:`metrics_text`
    gives (the engine process's, for its fronts; none in a single process, whose app renders it)."""

    def __init__(self, service: SelectionService, metrics=None):
        self.service, self.metrics = service, metrics

    @property
    def ready(self) -> bool:
        return self.service.ready

    @property
    def dim(self) -> int:
        return self.service.dim

    @property
    def encoder_id(self) -> str | None:
        return self.service.encoder_id

    @property
    def defaults(self) -> QueryParams:
        return self.service.defaults

    def queue_depth(self) -> int:
        return self.service.queue_depth()

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()

    async def select(self, items: list[SelectItem], batch: bool = False,
                     quota: Quota | None = None) -> list[Workspace]:
        return await self.service.select(items, batch, quota)

    async def append(self, bank_id: str, batch: AppendBatch, quota: Quota | None = None) -> Appended:
        return await self.service.append(bank_id, batch, quota)

    async def forget(self, bank_id: str, turn_ids: list[str] | None, where: Filter | None = None) -> Forgotten:
        return await self.service.forget(bank_id, turn_ids, where)

    async def has_bank(self, bank_id: str) -> bool:
        return self.service.has_bank(bank_id)

    async def bank_list(self) -> list[BankRow]:
        return self.service.bank_list()

    async def bank_info(self, bank_id: str, where: Filter | None = None) -> BankCounts | None:
        return self.service.bank_info(bank_id, where)

    async def history(self, bank_id: str, unit_id: str, where: Filter | None = None) -> list[Event] | None:
        return self.service.history(bank_id, unit_id, where)

    async def export_bank(self, bank_id: str, where: Filter | None = None, vectors: bool = False) -> Pieces:
        return await self.service.export_bank(bank_id, where, vectors)

    async def import_bank(self, bank_id: str, body: Lines, where: Filter | None = None,
                          quota: Quota | None = None) -> Imported:
        return await self.service.import_bank(bank_id, body, where, quota)

    async def metrics_text(self) -> bytes:
        return self.metrics.render() if self.metrics is not None else b""
