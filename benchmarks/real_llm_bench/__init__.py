"""The parts of ``bench_real_llm.py``: the per-path runs on the sample (``paths``, the replies
recorded by ``driver`` and read by ``analyze``) and the answer evaluation (``answers``)."""
