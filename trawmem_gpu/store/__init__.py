"""Persistence: one bank per directory, many banks per collection, packed tensors for engines."""
from .bank import Bank
from .collection import Collection, PackedCollection, bank_dirname, pack_banks
from .files import FORMAT_VERSION, load_bank, save_bank

__all__ = ["Bank", "Collection", "PackedCollection", "bank_dirname", "pack_banks", "FORMAT_VERSION", "load_bank",
           "save_bank"]
