"""``python -m trawmem_gpu.cli``: the ``trawmem`` command."""
import sys

from . import main

sys.exit(main())
