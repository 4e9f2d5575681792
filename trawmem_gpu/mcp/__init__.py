"""``trawmem mcp``: the memory as a Model Context Protocol server (``server``), a front over
:mod:`trawmem_gpu.memory` as the command line and ``serve`` are."""
