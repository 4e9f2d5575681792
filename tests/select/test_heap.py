"""``select.heap.trim_heap``: glibc's ``malloc_trim(0)`` after a large build, guarded."""
from __future__ import annotations

import sys

from trawmem_gpu.select import heap


def test_a_small_build_does_not_trim_and_a_large_one_does_on_glibc():
    assert heap.trim_heap(heap.TRIM_MIN_UNITS - 1) is False
    expected = heap._malloc_trim() is not None
    assert heap.trim_heap(heap.TRIM_MIN_UNITS) is expected
    if sys.platform.startswith("linux") and "glibc" in " ".join(__import__("platform").libc_ver()):
        assert expected  # on glibc the call is found


def test_without_glibc_nothing_is_called(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.trim_heap(10 ** 7) is False


def test_the_trim_is_what_is_called(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda: calls.append)
    assert heap.trim_heap(1 << 20) is True and calls == [0]
