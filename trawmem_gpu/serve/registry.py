"""The served banks live in :mod:`trawmem_gpu.memory.banks` (the Memory core); these names are
imported from here by the serve modules."""
from ..errors import DuplicateTurns
from ..memory.banks import AppendResult, BankRegistry, check_bank_id

__all__ = ["AppendResult", "BankRegistry", "DuplicateTurns", "check_bank_id"]
