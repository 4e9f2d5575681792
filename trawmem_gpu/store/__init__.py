"""Persistence: one bank per directory, many banks per collection, packed tensors for engines."""
from .bank import Bank
from .collection import Collection, PackedCollection, bank_dirname, pack_banks, repair_index
from .files import FORMAT_VERSION, load_bank, save_bank

__all__ = ["Bank", "Collection", "PackedCollection", "bank_dirname", "pack_banks", "FORMAT_VERSION", "load_bank",
           "repair_index", "save_bank"]
