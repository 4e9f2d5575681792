"""A deterministic TriMem "model" for the local protocol server (``LLMServer.responders``).

Replies follow the prompts of ``trawmem_gpu.ingest.layers.prompts``:

* extraction: one fact per turn of the window, ``<speaker> said: <text>``, citing the turn; a turn
  holding ``MALFORMED_ONCE`` makes the first reply malformed, ``BOGUS_ID`` adds an unknown source
  id to the first reply, ``EMPTY_ONCE`` makes the first reply empty (the retries are clean), and
  ``LAST_FRIDAY`` leaves the fact's date relative;
* profile: an identity line citing the first fact, an interests line citing the facts that say
  "likes", a career line citing those that say "works";
* profile update: only the section the new facts touch (career for "works", else interests);
* key information: the capitalized words of the question as persons; target queries: the
  question and its last four words; ``PLAN_FAIL`` in a question makes both replies malformed;
* critique / apply: a fixed critique, and the prompt with one rule appended (``EVOLVE_LINE``);
* anything else (answers, judgements) passes to the server's built-in replies.
"""
from __future__ import annotations

import json
import re

EVOLVE_LINE = "- Keep the exact adjectives and numbers of the turns."
_LINE = re.compile(r"^\[([^\]]+)\] \(([^)]*)\) ([^:]+): (.*)$")
_FACT = re.compile(r"^\[(F:[^\]]+)\](?: \([^)]*\))? (.*)$")


def _users(messages):
    return [m.get("content", "") for m in messages if m.get("role") == "user"]


def _facts_of(first: str, marker: str):
    block = first.split(marker, 1)[1].split("\n\nReply", 1)[0]
    return [m.groups() for m in (_FACT.match(x.strip()) for x in block.splitlines()) if m]


def _profile(person, facts):
    out = {"identity": [{"text": f"{person} is a person in this memory", "fact_ids": [facts[0][0]]}]}
    likes = [fid for fid, t in facts if "likes" in t]
    works = [fid for fid, t in facts if "works" in t]
    if likes:
        out["interests"] = [{"text": f"{person} has liked things", "fact_ids": likes}]
    if works:
        out["career"] = [{"text": f"{person} works", "fact_ids": works}]
    return out


def respond(messages):
    users = _users(messages)
    first, retry = (users[0] if users else ""), len(users) > 1
    if first.startswith("You improve the system prompt"):
        return json.dumps({"critique": "The prompt loses exact adjectives."})
    if first.startswith("Rewrite the system prompt"):
        prompt = first.split("Prompt:\n<<<\n", 1)[1].split("\n>>>", 1)[0]
        head, sep, tail = prompt.partition("\n\nTurns:")
        new = head + "\n" + EVOLVE_LINE + sep + tail if sep else prompt + "\n" + EVOLVE_LINE
        return json.dumps({"prompt": new})
    if first.startswith("You are a memory extraction agent"):
        block = first.split("Turns:\n", 1)[1].split("\n\nReply", 1)[0]
        if "MALFORMED_ONCE" in block and not retry:
            return '{"facts": [{"text": "broken'
        if "EMPTY_ONCE" in block and not retry:
            return '{"facts": []}'
        facts = []
        for ln in block.splitlines():
            m = _LINE.match(ln)
            if not m:
                continue
            tid, _, spk, text = m.groups()
            src = [tid] + (["ZZ:99"] if "BOGUS_ID" in text and not retry else [])
            facts.append({"text": f"{spk} said: {text}", "source_turns": src, "persons": [spk],
                          "keywords": text.split()[:2],
                          "date": "last Friday" if "LAST_FRIDAY" in text else "2031-05-0" + str(1 + len(facts) % 9)})
        return json.dumps({"facts": facts})
    if first.startswith("You build the profile of "):
        person = first[len("You build the profile of "):].split(" from facts", 1)[0]
        return json.dumps(_profile(person, _facts_of(first, "Facts:\n")))
    if first.startswith("You update the profile of "):
        person = first[len("You update the profile of "):].split(" with new facts", 1)[0]
        new = _facts_of(first, "New facts:\n")
        sec = "career" if any("works" in t for _, t in new) else "interests"
        return json.dumps({sec: [{"text": f"{person} updated {sec}", "fact_ids": [f for f, _ in new]}]})
    if first.startswith("Analyze the question"):
        q = first.split("Question: ", 1)[1].split("\n", 1)[0]
        if "PLAN_FAIL" in q:
            return "not json at all"
        return json.dumps({"keywords": q.split()[-2:], "persons": re.findall(r"\b[A-Z][a-z]+\b", q)[1:],
                           "time_expression": None, "location": None, "entities": []})
    if first.startswith("Plan searches"):
        q = first.split("Question: ", 1)[1].split("\n", 1)[0]
        if "PLAN_FAIL" in q:
            return "no"
        return json.dumps({"queries": [q, " ".join(q.rstrip("?").split()[-4:])]})
    return None


def write_locomo(path, sessions, qa):
    """A made-up LoCoMo-layout file (May 2031): ``sessions`` lists of (speaker, text), ``qa`` question dicts."""
    conv = {"speaker_a": "Ana", "speaker_b": "Ben"}
    for k, turns in enumerate(sessions, 1):
        conv[f"session_{k}_date_time"] = f"2:14 pm on {k + 1} May, 2031"
        conv[f"session_{k}"] = [{"speaker": s, "dia_id": f"D{k}:{i + 1}", "text": t} for i, (s, t) in enumerate(turns)]
    path.write_text(json.dumps([{"sample_id": "conv-x", "conversation": conv, "qa": qa}]))
    return path
