"""Parts of the scaling benchmarks (issue 33): ``query.py``, the query-side curves (per-query
latency and throughput against one bank's size, the number of banks and the batch size)."""
