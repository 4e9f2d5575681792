"""The parts of ``benchmarks/bench_scale.py`` (how the engine and its store scale), one module per concern:

``realtext`` the real-text bank of any size (the LoCoMo dev conversations repeated under new ids);
``writes`` the cost of appending one turn, forgetting one and compacting against the bank's size;
``opening`` open time and resident memory against the collection's size (eager and lazy);
``many`` many banks from one server under a resident budget: hot-bank latency beside an
all-resident server, cold opens; ``model`` the fitted model of where the time goes; ``report``
the figure. The query-side curves (latency against one bank's size, the number of banks, the batch
size) are ``query`` (:data:`QUERY_MODULE`), owned with the engine: the runner calls it when present.
"""

QUERY_MODULE = "benchmarks.scale_bench.query"
"""The query-side curves' module: ``run(args) -> dict`` (JSON-ready) and ``plot(axes, record)``;
``bench_scale`` records ``{"available": false}`` for them while the module is not in the tree."""
