"""``trawmem query`` / ``eval`` / ``demo`` (selection side of the CLI)."""
from __future__ import annotations


def add_commands(sub) -> None:
    pass
