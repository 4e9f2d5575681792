"""The wire between front processes and the engine process (:mod:`.remote`): frames (a 4-byte
length and a pickle of a list of messages), each call's arguments and each answer pickled on its
own inside them (:func:`blob`: one that fails fails its call only), errors as plain data
(:func:`error_fields` / :func:`error_from`: the same classes on the other side) and the outbox
that sends one frame per event-loop iteration."""
from __future__ import annotations

import asyncio
import logging
import pickle
import struct

from ..errors import InputError, QuarantinedBank, UnknownBank
from .batcher import DeadlineExceeded, OutcomeUnknown, QueueFull, ShuttingDown

log = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
MAX_FRAME = 1 << 30
"""Largest frame either side accepts (a corrupt length fails the connection, not the process)."""


class EngineCallFailed(RuntimeError):
    """One call to the engine process failed inside the engine (an unexpected exception, or its
    arguments or answer could not cross the socket); the server goes on (HTTP 500 naming it)."""


def blob(obj) -> bytes:
    """``obj`` pickled on its own (one call's arguments or one answer inside a frame)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_FRAME:
        raise ValueError(f"{len(data)} bytes; the limit is {MAX_FRAME}")
    return data


def frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_FRAME:
        raise ValueError(f"frame of {len(data)} bytes is over the {MAX_FRAME} limit")
    return _LEN.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader):
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes announced; the limit is {MAX_FRAME}")
    return pickle.loads(await reader.readexactly(n))


def _error_kinds() -> tuple:
    """(kind, class, fields of an instance) for each exception that crosses the socket as itself;
    a subclass before its base. The class called with the fields makes the same exception."""
    from ..errors import DuplicateTurns

    def msg(e):
        return (str(e),)

    return (("queue_full", QueueFull, lambda e: (e.retry_after, str(e))), ("deadline", DeadlineExceeded, msg),
            ("outcome_unknown", OutcomeUnknown, msg),
            ("shutting_down", ShuttingDown, msg), ("unknown_bank", UnknownBank, lambda e: (e.bank_id, e.where, e.detail)),
            ("quarantined", QuarantinedBank, lambda e: (e.bank_id, e.cause, e.where)),
            ("duplicate", DuplicateTurns, msg), ("input", InputError, msg))


def error_fields(e: BaseException) -> tuple:
    """An exception as plain data (kind, fields) for the other process."""
    for kind, cls, fields in _error_kinds():
        if isinstance(e, cls):
            return (kind, *fields(e))
    return ("internal", type(e).__name__)


def error_from(fields: tuple) -> Exception:
    """The exception :func:`error_fields` described, of the same class."""
    kind, *rest = fields
    for k, cls, _ in _error_kinds():
        if k == kind:
            return cls(*rest)
    return EngineCallFailed(f"the engine process failed on this call ({rest[0] if rest else 'unknown error'}); "
                            "the server goes on")


class Outbox:
    """Messages for one connection, sent as one frame (a list) per event-loop iteration: the
    answers of one engine batch complete together and cross in one write."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer, self.msgs = writer, []

    def answer(self, rid: int, ok: bool, payload) -> None:
        """Put one answer, pickled on its own: one that cannot be pickled goes as its error."""
        try:
            data = blob(payload)
        except Exception as e:  # noqa: BLE001 - this call's answer fails, not the connection
            log.exception("the answer to engine call %s could not be pickled", rid)
            ok, data = False, blob(("internal", f"answer not sent: {type(e).__name__}"))
        self.put((rid, ok, data))

    def put(self, msg) -> None:
        if not self.msgs:
            asyncio.get_running_loop().call_soon(self.flush)
        self.msgs.append(msg)

    def flush(self) -> None:
        msgs, self.msgs = self.msgs, []
        if msgs and not self.writer.is_closing():
            self.writer.write(frame(msgs))
