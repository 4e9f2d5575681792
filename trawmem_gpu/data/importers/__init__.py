"""Importers of other memory formats (issue 45 item 3): each module maps its format's records into
export ``turn`` records (``docs/export.md``, mapping documented there) as ``(bank_id, turn)`` pairs;
:data:`IMPORTERS` names them for ``trawmem import --format``."""
from __future__ import annotations

import importlib
from collections.abc import Iterator

from ...errors import InputError

IMPORTERS: dict[str, str] = {
    "openai": "trawmem_gpu.data.importers.openai",
    "mem0": "trawmem_gpu.data.importers.mem0",
    "graphiti": "trawmem_gpu.data.importers.graphiti",
    "locomo": "trawmem_gpu.data.importers.conversations",
    "longmemeval": "trawmem_gpu.data.importers.conversations",
}


def read_turns(fmt: str, path) -> Iterator[tuple[str, dict]]:
    """The ``(bank_id, turn record)`` pairs of file ``path`` in format ``fmt``, banks contiguous."""
    if fmt not in IMPORTERS:
        raise InputError(f"format: unknown format {fmt!r} (known: trawmem, {', '.join(IMPORTERS)})")
    return importlib.import_module(IMPORTERS[fmt]).read(path, fmt)


def flat(meta) -> dict | None:
    """The scalar entries of ``meta`` (nested values dropped: our metadata is flat), or None."""
    out = {k: v for k, v in (meta or {}).items() if isinstance(k, str) and isinstance(v, (str, int, float, bool))}
    return out or None
