"""The service's engine lives in :mod:`trawmem_gpu.memory.engines` (the Memory core)."""
from ..memory.engines import ServedEngine, select_units

__all__ = ["ServedEngine", "select_units"]
