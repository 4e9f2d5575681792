"""Memory where agents already live: thin fronts for agent frameworks, one module per framework.

Each is an optional extra that imports its framework only when used; none selects, filters or
appends on its own: they translate the framework's calls into ``Memory`` / ``AsyncMemory`` calls,
which reach the engine through the one selection call (``trawmem_gpu.select.client``).
"""
