"""The parts of ``benchmarks/bench_equal_tokens.py``: ``data`` the dev sets, the configs and the
selection of every method fold by fold; ``stats`` the scores, the margin bootstrap and where
TrawMem loses; ``report`` the markdown tables and the figure."""
