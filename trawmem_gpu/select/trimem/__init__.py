"""TriMem's retrieval (``--method trimem``): the query plan (``plan``: key information, target
queries, and the follow-up step planned TrawMem uses), the fused fact ranking (``retrieve``) and
the harnesses' method (``method``). Its extraction and profiles are built at ingest
(``ingest.layers``), its prompt evolution is ``eval.evolve``; docs/trimem.md describes them and
what was measured."""
