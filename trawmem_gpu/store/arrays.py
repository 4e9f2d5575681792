"""Row arrays that grow at the end without copying what they hold (an append's unit vectors).

:func:`extend_rows` returns ``a`` with ``rows`` after it. When ``a`` is the whole written part of a
buffer made here with room to spare, the rows are written into that room and a longer view is
returned: ``a`` itself (the bank an append started from) still shows its own rows only, and the
buffer's written length moves on, so a second extension of the same ``a`` (a retried append)
copies instead of overwriting what the first one wrote. Otherwise the rows are copied into a new
buffer with room for about a quarter more. Appending ``k`` rows to ``N`` therefore costs ``O(k)``
amortized, not ``O(N)``.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

_written: dict[int, tuple] = {}
"""id(buffer) -> (a weak reference to it, rows written); views of its first rows are the arrays
handed out. An entry goes with its buffer."""
_lock = threading.Lock()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def extend_rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``np.concatenate([a, rows])`` in amortized ``O(len(rows))`` (see the module docstring)."""
    rows = np.asarray(rows, dtype=a.dtype)
    n, k = len(a), len(rows)
    with _lock:
        buf = a.base
        ref, end = _written.get(id(buf), (None, -1))
        if (ref is not None and ref() is buf and end == n and a.flags.c_contiguous and _address(a) == _address(buf)
                and buf.shape[1:] == a.shape[1:] and buf.shape[0] >= n + k):
            buf[n:n + k] = rows
            _written[id(buf)] = (ref, n + k)
            return buf[:n + k]
        buf = np.empty((n + k + max((n + k) // 4, 64), *a.shape[1:]), dtype=a.dtype)
        buf[:n] = a
        buf[n:n + k] = rows
        key = id(buf)
        _written[key] = (weakref.ref(buf, lambda _, key=key: _written.pop(key, None)), n + k)
        return buf[:n + k]


_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_tensors(path, mmap: bool = False) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file: read (``safetensors.numpy.load_file``), or, with
    ``mmap``, copy-on-write ``numpy.memmap`` views of the file itself (its documented layout: an
    8-byte little-endian header length, a JSON header of dtype, shape and byte offsets, then the
    data), so the pages are the file's page cache, shared and dropped with the mapping.

    :raises ValueError: a header that is not a safetensors header (the caller names the file)
    """
    import os

    from ..errors import loads_json

    if not mmap:
        from safetensors.numpy import load_file

        return load_file(str(path))
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("truncated header")
        n = int.from_bytes(head, "little")
        if n <= 0 or 8 + n > size:
            raise ValueError(f"header length {n} does not fit a file of {size} bytes")
        header = loads_json(f.read(n).decode("utf-8"))
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dt = np.dtype(_DTYPES[spec["dtype"]])
        shape = tuple(int(x) for x in spec["shape"])
        a, b = (int(x) for x in spec["data_offsets"])
        count = int(np.prod(shape, dtype=np.int64))
        if b - a != count * dt.itemsize or 8 + n + b > size:
            raise ValueError(f"tensor {name!r}: {b - a} bytes for shape {shape} of {dt}")
        out[name] = np.memmap(path, dtype=dt, mode="c", offset=8 + n + a, shape=shape) if count \
            else np.zeros(shape, dtype=dt)
    return out
