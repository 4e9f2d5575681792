"""The parts of ``benchmarks/paper_analyses.py``: ``paper`` the paper's reported numbers and
why ours differ, ``common`` the shared statistics and plotting, ``figures`` Figs. 8, 10 and 12
(per-query counts), ``roles`` Figs. 7 and 9 (role shifts, coverage and redundancy), ``table3``
Table 3 and the paper-vs-ours summary."""
