"""The in-process reference: encode + select at a cell's batch size, and the encoder's CPU
cost by chunk size."""
from __future__ import annotations

import time

import numpy as np


class InProcess:
    """Encode + select in this process on the servers' banks and questions, with their config and
    threads (pinned by the caller), to pair each served cell with the rate at its batch size."""

    def __init__(self, banks, items, threads: int, encode_chunk: int):
        from trawmem_gpu.encode import get_encoder
        from trawmem_gpu.select.engine import SelectionEngine

        self.enc = get_encoder("minilm", cache=False)
        self.eng = SelectionEngine(banks, threads=threads)
        self.items = items
        self.encode_chunk = encode_chunk
        self.pos = 0
        self.rate(4, 0.5)  # warm-up (numba, encoder)

    def rate(self, batch: int, seconds: float) -> float:
        """Queries/s of encode + select in batches of ``batch`` for about ``seconds``."""
        batch = max(1, int(round(batch)))
        n, t0 = 0, time.perf_counter()
        while True:
            chunk = [self.items[(self.pos + i) % len(self.items)] for i in range(batch)]
            self.pos += batch
            ids, qs = [b for b, _ in chunk], [q for _, q in chunk]
            Z = self.enc.encode(qs, is_query=True, batch_size=self.encode_chunk)
            self.eng.select_units(ids, qs, Z)
            n += batch
            dt = time.perf_counter() - t0
            if dt >= seconds:
                return n / dt


def encoder_chunks(enc, questions: list[str], rounds: int = 3, n: int = 128) -> dict:
    """CPU ms per question of the query encoder, one question at a time and in length-sorted
    chunks of 8-64 (``--encode-chunk``), interleaved over rounds; medians."""
    out: dict = {}
    for _ in range(rounds):
        for chunk in (1, 8, 16, 32, 64):
            qs = questions[:n // 8] if chunk == 1 else questions[:n]
            c0 = time.process_time()
            if chunk == 1:
                for q in qs:
                    enc.encode([q], is_query=True)
            else:
                for s in range(0, len(qs), 64):
                    enc.encode(qs[s:s + 64], is_query=True, batch_size=chunk)
            out.setdefault(chunk, []).append((time.process_time() - c0) / len(qs) * 1e3)
    return {c: float(np.median(v)) for c, v in out.items()}
