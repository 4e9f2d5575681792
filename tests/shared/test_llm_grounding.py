"""The checks an LLM output must pass (``llm.grounding``) on the outputs a 135M model gave in the
issue's runs, and on good ones; and the one structured call (``llm.structured.ask``): schema sent,
malformed re-asked, refused and cut counted, ``--strict-llm``."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trawmem_gpu.errors import LLMFallbackError
from trawmem_gpu.llm import FakeBackend
from trawmem_gpu.llm.base import LLMWork, work_line
from trawmem_gpu.llm.grounding import answer_problem, echoes, embedding_support, fact_problem, head_problem, \
    lexical_support, markup, search_problem
from trawmem_gpu.llm.prompts import HEAD
from trawmem_gpu.llm.structured import ask, fell_back, parse_head

THREAD = ["Ben: I won the 10k race yesterday in Porto!", "Ana: Congrats Ben, I ran the half marathon in March."]


@pytest.mark.parametrize("head,why", [
    ("Ben", "words"),
    ("Ben's victory, Ana's victory", "words"),
    ("Ben and Ana both won races in Porto </one sentence>", "markup"),
    ("The head of the gym is a professional, and he's going to be training for the upcoming marathon.",
     "not supported"),
    ("Summarize the following conversation thread in one sentence: Ben won", "prompt"),
    ("Summary: [2024-03-02T10:15:00] [2024-03-02T10:15:", "states nothing"),
    ("Ben Ben Ben Ben Ben", "states nothing"),  # SmolLM2-135M on the sample: one name, five times
])
def test_heads_a_small_model_wrote_are_refused(head, why):
    got = head_problem(head, THREAD, HEAD.template)
    assert got is not None and why in got


def test_a_grounded_head_passes():
    assert head_problem("Ben tells Ana he won the 10k race in Porto, and Ana ran the half marathon.", THREAD,
                        HEAD.template) is None


def test_support_measures():
    assert lexical_support("Ben won the race", THREAD) == 1.0
    assert lexical_support("Clara moved to Rotterdam", THREAD) == 0.0
    assert lexical_support("", THREAD) == 1.0
    v = np.eye(3, dtype=np.float32)
    assert embedding_support(v[0], v) == pytest.approx(1.0) and embedding_support(v[0], v[1:]) == 0.0
    assert embedding_support(v[0], np.zeros((0, 3))) == -1.0


def test_facts_must_be_supported_by_the_turns_they_cite():
    cited = ["Ben 2 March 2024 I won the 10k race yesterday in Porto!"]
    assert fact_problem("Ben won the 10k race in Porto on 1 March 2024.", cited) is None
    assert "not supported" in fact_problem("Ana adopted a beagle called Rex.", cited)
    assert "turn ids" in fact_problem("Ben won the race [D1:3].", cited)
    assert "too short" in fact_problem("Ben.", cited)


def test_answers_that_echo_the_question_or_copy_the_workspace_are_refused():
    ctx = "## 29 January 2023\n[D1:4] Gina: I opened my online clothing store.\n[D1:5] Jon: Congrats!"
    q = "When did Gina open her online clothing store?"
    assert answer_problem("When did Gina open her online clothing store?", q, ctx) == "echoes the question"
    assert "turn ids" in answer_problem("## 29 January 2023 [D1:4] Gina: I opened my store", q, ctx)
    assert "heading" in answer_problem("## 29 January 2023\nGina opened a store", q, ctx)
    assert "speaker" in answer_problem("Gina: I opened my online store last week.", q, ctx)
    assert "prompt" in answer_problem("Question: when? Memory: none", q, ctx)
    assert answer_problem("29 January 2023", q, ctx) is None
    assert answer_problem("Not mentioned in the conversation.", q, ctx) is None
    assert answer_problem("Melanie", "Did Melanie or Caroline go hiking?", ctx) is None
    assert answer_problem("", q, ctx) == "empty answer"
    assert echoes("Gina opened her online clothing store", q) and not echoes("Yes", "Is it?")


def test_searches_are_questions_not_dates_or_markup():
    assert search_problem("2 March 2024") and search_problem("  ") and search_problem('{"queries": []}')
    assert search_problem("When did Ana run her first half marathon?") is None
    assert search_problem("Clara Rotterdam move") is None
    assert markup("a plain sentence") is None


def _heads_model(replies: dict):
    def reply(conv):
        text = conv[0]["content"]
        key = next((k for k in replies if k in text), None)
        users = [m for m in conv if m["role"] == "user"]
        return replies[key][min(len(users), len(replies[key])) - 1] if key else "?"
    return reply


def test_ask_sends_the_schema_re_asks_malformed_and_counts_what_it_refuses():
    sent = []
    fb = FakeBackend(_heads_model({
        "good": [json.dumps({"head": "Ben tells Ana he won the 10k race in Porto."})],
        "once": ["not json", json.dumps({"head": "Ana ran the half marathon in March in Porto."})],
        "never": ["still not json", "nor now"],
        "short": [json.dumps({"head": "Ben"})]}))
    inner = fb._chat
    fb._chat = lambda batch, schema=None, **kw: (sent.append(schema), inner(batch, **kw))[1]
    fb.takes_schema = True
    convs = [HEAD.messages(thread=f"{k}: " + " ".join(THREAD)) for k in ("good", "once", "never", "short")]
    with LLMWork(fb) as work:
        outs = ask(fb, HEAD, convs, lambda i, t: parse_head(t), desc="head", max_tokens=64,
                   check=lambda i, v: head_problem(v, THREAD))
        whys = fell_back(fb, "head", outs, "head")
    assert [o.status for o in outs] == ["ok", "ok", "malformed", "refused"]
    assert [o.asked for o in outs] == [1, 2, 2, 1] and outs[1].first == "malformed"
    assert sent and all(schema == HEAD.schema for schema in sent)
    t = work.report()["totals"]
    assert (t["replies"], t["malformed"], t["refused"], t["retries"], t["fallbacks"]) == (6, 3, 1, 2, 2)
    assert t["malformed_share"] == 0.5 and "2 fell back" in work_line(t)
    assert t["checked"] == 3 and t["refused_share"] == 0.3333  # of the replies that could be read
    assert whys == {"malformed reply": 1, "refused: 1 words (a head has 5 to 60)": 1}
    fb.strict = True
    with pytest.raises(LLMFallbackError, match=r"`strict`: 1 of 1 head head\(s\) would fall back: malformed"):
        fell_back(fb, "head", [outs[2]], "head")
