"""TriMem (the second seed): LLM fact extraction (``extract``), per-person profiles (``profiles``,
``build``), TriMem's query planning and retrieval (``plan``, ``retrieve``, ``method``: ``--method
trimem``), its prompts (``prompts``) and their TextGrad-style evolution (``evolve``, ``cli``:
``trawmem evolve-prompts``). docs/trimem.md describes them and what was measured."""
