"""The parts of ``benchmarks/bench_select.py`` (selection throughput), one module per concern:

``impls`` the timed implementations (batched engine, reference loop, apricot's greedy);
``data`` the LoCoMo dev and synthetic query sets; ``sweeps`` the target point and the one-variable sweeps;
``scale`` the seed-search and collection-scaling runs; ``gpu`` the GPU target; ``paired`` the
interleaved pairs (``--versus`` another tree, ``--tokens``); ``report`` the tables and figures.
"""
