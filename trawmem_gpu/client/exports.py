"""The bytes of an export (``docs/export.md``) sent for an import and written from an export:
``Client.import_`` / ``Client.export`` take a path, bytes or a stream, as ``Memory`` does.

A path is read in pieces as the request sends it (and again for a retry); an export is written
as its pieces arrive: to a path through a temporary sibling renamed over it at the end (an export
cut short leaves no file), or to the stream given. Neither is held whole.
"""
from __future__ import annotations

import codecs
import os
import tempfile
from contextlib import contextmanager

PIECE_BYTES = 64 << 10


def read_export(source):
    """What an import sends for ``source``: a path, as a function that makes a reader of its
    pieces (each try reads the file again); bytes, or a binary or text stream (read here), as bytes."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        with open(path, "rb"):  # a missing file fails here, not in the middle of a request
            pass
        return lambda: _pieces(path)
    data = source if isinstance(source, bytes) else source.read()
    return data.encode("utf-8") if isinstance(data, str) else data


def _pieces(path: str):
    with open(path, "rb") as f:
        while piece := f.read(PIECE_BYTES):
            yield piece


def content(raw, aio: bool):
    """The request content of :func:`read_export`'s answer (an async reader for the async client)."""
    if not callable(raw):
        return raw
    return _areader(raw) if aio else raw()


async def _areader(raw):
    for piece in raw():
        yield piece


class ExportSink:
    """Where an export's pieces go as they arrive (``out``: a path, or a binary or text stream);
    :meth:`close` ends it (a path: renamed into place), :meth:`abort` drops a path's partial file."""

    def __init__(self, out):
        self.out, self.size, self.tmp = out, 0, None
        self.text = codecs.getincrementaldecoder("utf-8")()  # a piece may end inside a character
        if isinstance(out, (str, os.PathLike)):
            d = os.path.dirname(os.path.abspath(os.fspath(out)))
            fd, self.tmp = tempfile.mkstemp(prefix=f".{os.path.basename(os.fspath(out))}.tmp-", dir=d)
            self.f = os.fdopen(fd, "wb")
        else:
            self.f = out

    def write(self, piece: bytes) -> None:
        if self.tmp is None and hasattr(self.f, "encoding"):  # a text stream
            self.f.write(self.text.decode(piece))
        else:
            self.f.write(piece)
        self.size += len(piece)

    def close(self) -> int:
        if self.tmp is not None:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.tmp, self.out)
            self.tmp = None
        return self.size

    def abort(self) -> None:
        if self.tmp is not None:
            self.f.close()
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = None


@contextmanager
def sunk(sink: ExportSink):
    """``sink`` closed when the block ends, aborted when it raises."""
    try:
        yield sink
    except BaseException:
        sink.abort()
        raise
    sink.close()
