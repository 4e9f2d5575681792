"""One-off experiments: measurements that settled a question and are kept for the record, not
maintained with the suite (``python -m benchmarks list``). Each runs from the repository root as
``python -m benchmarks.experiments.NAME`` and writes under ``benchmarks/results/archive/`` (or
``--out-dir`` / ``--out``, or ``TRAWMEM_BENCH_OUT``); ``benchmarks/README.md`` lists them with
their results.
"""
