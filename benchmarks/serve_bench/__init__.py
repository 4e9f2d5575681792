"""The parts of ``benchmarks/bench_serve.py`` (the load test of ``trawmem serve``):
``servers`` the data and the server subprocesses, ``load`` the closed-loop clients and one
measured cell, ``inproc`` the in-process reference rate, ``report`` the medians, targets, table
and figure."""
