"""Stage 1: segmentation, heads, encoding and the thread graph."""
from .builder import build_banks, update_bank

__all__ = ["build_banks", "update_bank"]
