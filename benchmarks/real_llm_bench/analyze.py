"""Reads a driver record (``driver.py``) with this tree's parsers and checks, whatever tree sent it.

Each request is told apart by its prompt's opening words (:data:`KINDS`); its reply is read by
the parser of that prompt (malformed: it gives nothing) and, when read, held to the checks of
``llm.grounding`` (refused: a check says why). So a run of the old code shows how much of what it
stored unchecked the checks would have refused, and runs with and without constrained decoding
show the share of malformed replies each gets.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

KINDS = (("Below are the turns of one conversation session", "segment"),
         ("Summarize the following conversation thread", "head"),
         ("You are a memory extraction agent", "extract"), ("You build the profile of", "profile"),
         ("You update the profile of", "profile_update"), ("Analyze the question", "key_info"),
         ("Plan searches", "target_query"), ("A memory of past conversations was searched", "follow_up"),
         ("You grade an answer", "judge"), ("You are answering a question", "answer"),
         ("You improve the system prompt", "critique"), ("Rewrite the system prompt", "apply"))


def kind_of(messages: list[dict]) -> str:
    first = next((m["content"] for m in messages if m["role"] == "user"), "")
    return next((k for prefix, k in KINDS if first.startswith(prefix)), "other")


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0] if start in text else ""


def read_reply(kind: str, prompt: str, text: str):
    """``(value, why refused or None)``; value None: malformed (or a plain-text kind: the text)."""
    from trawmem_gpu.ingest.layers.trimem_extract import parse_reply
    from trawmem_gpu.ingest.llm_threads import _degenerate
    from trawmem_gpu.llm.grounding import answer_problem, fact_problem, head_problem, search_problem
    from trawmem_gpu.llm.prompts import HEAD
    from trawmem_gpu.llm.structured import extract_json, parse_boundaries, parse_head, parse_judge
    from trawmem_gpu.select.trimem.plan import parse_follow_ups, parse_key_info, parse_queries

    if kind == "segment":
        n = len(re.findall(r"(?m)^\[\d+\] ", prompt))
        v = parse_boundaries(text, n)
        return v, None if v is None else _degenerate(v, n)
    if kind == "head":
        v = parse_head(text)
        lines = [re.sub(r"^\[[^\]]*\]\s*", "", x) for x in _between(prompt, "Thread:\n", "\n\nReply").splitlines()]
        return v, None if v is None else head_problem(v, lines, HEAD.template)
    if kind == "extract":
        window = _between(prompt, "Turns:\n", "\n\nReply")
        texts = {m.group(1): m.group(2) for m in re.finditer(r"(?m)^\[([^\]]+)\] (.*)$", window)}
        p = parse_reply(text, set(texts))
        if p.malformed:
            return None, None
        bad = [e["text"] for e in p.entries if not e["source_turns"]
               or fact_problem(e["text"], [texts[s] for s in e["source_turns"]])]
        return p, (f"{len(bad)} of {len(p.entries)} facts unsupported" if bad else None)
    if kind in ("profile", "profile_update"):
        v = extract_json(text)
        return (v, None) if isinstance(v, dict) else (None, None)
    if kind == "key_info":
        v = parse_key_info(text)
        return v, None if v is None or any(v.values()) else "degenerate: no key information"
    if kind in ("target_query", "follow_up"):
        q = _between(prompt, "Question: ", "\n")
        v = parse_queries(text, q) if kind == "target_query" else parse_follow_ups(text, [q])
        if v is None:
            return None, None
        extra = [s for s in (v[1:] if kind == "target_query" else v) if search_problem(s) is None]
        return v, None if extra or kind == "follow_up" else "degenerate: no search beyond the question"
    if kind == "judge":
        v = parse_judge(text)
        return v, None
    if kind == "answer":
        q = _between(prompt, "Question: ", "\n")
        ctx = _between(prompt, "Memory:\n", "\n\nQuestion: ")
        return text, answer_problem(text, q, ctx)
    if kind in ("critique", "apply"):
        v = extract_json(text)
        key = "critique" if kind == "critique" else "prompt"
        return (v, None) if isinstance(v, dict) and isinstance(v.get(key), str) else (None, None)
    return text, None


def summarize(record: Path) -> dict:
    """Per kind of request: requests, re-asks, failed, replies read, malformed (complete but not
    readable), cut (stopped at the token limit: incomplete), refused (would be, for code without
    checks), seconds and tokens; and examples of what was malformed, cut and refused."""
    rows = [json.loads(x) for x in Path(record).read_text(encoding="utf-8").splitlines() if x.strip()] \
        if Path(record).exists() else []
    out: dict[str, Counter] = {}
    examples: dict[str, list] = {}
    for r in rows:
        k = kind_of(r["messages"])
        c = out.setdefault(k, Counter())
        c["requests"] += 1
        c["re_asks"] += sum(m["role"] == "user" for m in r["messages"]) > 1
        c["schema"] += bool(r.get("schema"))
        c["seconds"] += float(r.get("latency_s") or 0.0)
        c["prompt_tokens"] += int(r.get("prompt_tokens") or 0)
        c["completion_tokens"] += int(r.get("completion_tokens") or 0)
        if r.get("error"):
            c["failed"] += 1
            continue
        c["replies"] += 1
        c["cut"] += r.get("finish") == "length"
        prompt = next(m["content"] for m in r["messages"] if m["role"] == "user")
        v, why = read_reply(k, prompt, r["text"])
        if v is None and r.get("finish") == "length":
            examples.setdefault(f"{k} cut", []).append(r["text"][-160:])
        elif v is None:
            c["malformed"] += 1
            examples.setdefault(f"{k} malformed", []).append(r["text"][:160])
        elif why:
            c["refused"] += 1
            examples.setdefault(f"{k} refused", []).append(f"{r['text'][:160]}  <- {why}")
    res = {}
    for k, c in out.items():
        d = dict(c)
        d["seconds"] = round(d.get("seconds", 0.0), 1)
        n = d.get("replies", 0)
        d["malformed_share"] = round(d.get("malformed", 0) / n, 3) if n else None
        d["refused_share"] = round(d.get("refused", 0) / n, 3) if n else None
        res[k] = d
    return {"kinds": res, "examples": {k: v[:5] for k, v in examples.items()}}
