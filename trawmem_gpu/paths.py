"""Where the package keeps its caches, and the digest that names a file's content.

Shared by every stage (embedding, tokenizer, LLM and bank caches; data-file identities), so it
imports nothing of the package.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def default_cache_dir() -> Path:
    """The cache root: ``TRAWMEM_CACHE`` when set, else ``~/.cache/trawmem_gpu``."""
    return Path(os.environ.get("TRAWMEM_CACHE", Path.home() / ".cache" / "trawmem_gpu"))


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks (a multi-GB data file is never held whole)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
