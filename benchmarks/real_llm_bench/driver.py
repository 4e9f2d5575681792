"""Runs one ``trawmem`` command (or a Python snippet) with the code of whichever tree ``PYTHONPATH``
names, and records every chat request its HTTP backend sends and what came back.

    python driver.py RECORD.jsonl cli build --input ... --llm URL
    python driver.py RECORD.jsonl python "from trawmem_gpu import Memory; ..."

Each line of ``RECORD.jsonl``: the stage (``desc``), JSON mode, whether a schema went with it, the
reply budget, the messages, and the reply (text, error, finish reason, seconds, tokens). It wraps
``OpenAIHTTPBackend._chat`` and ``VLLMOfflineBackend._chat``, which every tree has (an older one
without ``schema``), so the same record comes out of the code before and after a change. Standard library and the tree only.
"""
from __future__ import annotations

import json
import sys
import threading


def _install(path: str) -> None:
    from trawmem_gpu.llm import openai_http, vllm_offline

    lock = threading.Lock()
    for cls in (openai_http.OpenAIHTTPBackend, vllm_offline.VLLMOfflineBackend):
        _wrap(cls, path, lock)


def _wrap(cls, path: str, lock) -> None:
    inner = cls._chat

    def recorded(self, batch, **kw):
        try:
            res = inner(self, batch, **kw)
        except Exception as e:  # every request failed (the backend raises): record them as failed
            _write(path, lock, kw, batch, [None] * len(batch), f"{type(e).__name__}: {e}")
            raise
        _write(path, lock, kw, batch, res, None)
        return res

    cls._chat = recorded


def _write(path: str, lock, kw: dict, batch, res, raised) -> None:
    with lock, open(path, "a", encoding="utf-8") as f:
        for conv, r in zip(batch, res):
            f.write(json.dumps({
                "desc": kw.get("desc"), "json_mode": kw.get("json_mode"), "schema": kw.get("schema") is not None,
                "max_tokens": kw.get("max_tokens"), "messages": conv, "text": r.text if r else "",
                "error": r.error if r else raised, "finish": getattr(r, "finish_reason", None),
                "latency_s": r.latency_s if r else None, "prompt_tokens": r.prompt_tokens if r else 0,
                "completion_tokens": r.completion_tokens if r else 0}) + "\n")


def main(argv: list[str]) -> int:
    path, how, rest = argv[0], argv[1], argv[2:]
    _install(path)
    if how == "cli":
        from trawmem_gpu.cli import main as cli

        return cli(rest)
    exec(rest[0], {"__name__": "__driver__"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
