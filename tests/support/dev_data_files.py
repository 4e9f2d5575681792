"""Where the dev data lies for the tests, and what a missing file does: skips a test with a
one-line reason naming ``TRAWMEM_DEV_DATA`` on a newcomer's clone, fails it under CI.

A support module (not ``tests/conftest.py``) so test files import it by a name no other folder's
``conftest.py`` shadows."""
import os
from pathlib import Path

import pytest


def _dev_file(name: str) -> Path:
    """Where the ``name`` dev file lies: the benchmarks' one rule (``benchmarks.harness.dev_data``:
    ``TRAWMEM_DEV_DATA`` names the LoCoMo file or a folder laid out like ``../shared/data``)."""
    from benchmarks.harness import dev_data

    return dev_data(name)


def need_dev_data(name: str = "locomo") -> Path:
    """The dev file, or this test skipped with a one-line reason naming ``TRAWMEM_DEV_DATA``.

    Under CI (``CI=true``), which always has the data beside the clone, a missing file fails the
    test instead: a lost data path must not turn quality floors into silent skips."""
    p = _dev_file(name)
    if not p.exists():
        msg = (f"{name} dev data not found at {p}; set TRAWMEM_DEV_DATA to the LoCoMo file or to a "
               f"folder with locomo/ and longmemeval/")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " (CI=true: the data must be there)")
        pytest.skip(msg)
    return p
