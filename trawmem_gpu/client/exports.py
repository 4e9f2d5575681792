"""The bytes of an export (``docs/export.md``) read for an import and written from an export:
``Client.import_`` / ``Client.export`` take a path, bytes or a stream, as ``Memory`` does."""
from __future__ import annotations

import os


def read_export(source) -> bytes:
    """The bytes of ``source``: a path, bytes, or a binary or text stream."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read()
    data = source if isinstance(source, bytes) else source.read()
    return data.encode("utf-8") if isinstance(data, str) else data


def write_export(out, body: bytes) -> int:
    """``body`` into ``out`` (a path, or a binary or text stream); its size in bytes."""
    if isinstance(out, (str, os.PathLike)):
        with open(out, "wb") as f:
            f.write(body)
    elif hasattr(out, "encoding"):  # a text stream
        out.write(body.decode("utf-8"))
    else:
        out.write(body)
    return len(body)
