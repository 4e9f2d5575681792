"""The bank's schema and its files: ``bank`` (turns, threads, vectors), ``graph`` (the thread
graph's edge kinds and edges), ``facts`` (the facts and profile records beside the turns), ``view``
(the unit view that selection takes as a bank), ``files`` (one bank per directory), ``collection``
(many banks, packed tensors for engines) and ``verify``."""
from .bank import Bank
from .collection import Collection, PackedCollection, bank_dirname, pack_banks
from .repair import repair_index
from .files import FORMAT_VERSION, load_bank, save_bank

__all__ = ["Bank", "Collection", "PackedCollection", "bank_dirname", "pack_banks", "FORMAT_VERSION", "load_bank",
           "repair_index", "save_bank"]
