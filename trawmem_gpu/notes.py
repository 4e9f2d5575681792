"""Where library code's one-line notes for the person at the terminal go (a damaged cache set
aside, banks reused or rebuilt, a rerun's resume point, an evaluation's summary).

Library code never prints (tests/test_layout.py): it hands each line to :func:`note` with its own
module's logger. A command (``trawmem_gpu/cli``) shows the notes of its run by entering
:func:`said_by` with the functions that print them, on the stream each line always went to; code
that enters nothing gets each note as an INFO record of the calling module's logger. As the
server's status lines do (``serve.config.log_line`` by default), a :data:`Say` is a plain ``line -> None``.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator

Say = Callable[[str], None]
"""Where one line goes: ``line -> None``."""

_SAYS: dict[str, Say] = {}
"""The stream name (``stderr``, ``stdout``) -> the :data:`Say` a command entered for it (a plain
dict, not a context variable: a note from a worker thread of the command is the command's too)."""


def note(log: logging.Logger, line: str, stream: str = "stderr") -> None:
    """``line`` to what the running command gave for ``stream``, else an INFO record of ``log``."""
    say = _SAYS.get(stream)
    if say is None:
        log.info("%s", line)
    else:
        say(line)


@contextmanager
def said_by(stderr: Say, stdout: Say | None = None) -> Iterator[None]:
    """Within it, notes go to ``stderr`` (and those meant for stdout to ``stdout``); the streams
    given before are put back after."""
    before = dict(_SAYS)
    _SAYS.update({"stderr": stderr, **({"stdout": stdout} if stdout else {})})
    try:
        yield
    finally:
        _SAYS.clear()
        _SAYS.update(before)
