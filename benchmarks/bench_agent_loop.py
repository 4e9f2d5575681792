"""A LangChain v1 / LangGraph agent loop (``langchain.agents.create_agent``, the real packages)
over conversations and their questions, three arms side by side in one run:

* ``trawmem``: :class:`~trawmem_gpu.integrations.langchain.TrawMemMiddleware` at token budget T
  (read only, ``store=False``, so every arm reads the same bank);
* ``none``: the same agent without memory;
* ``hybrid``: :class:`HybridTopK`, a middleware of the same shape (the same header, the same place
  in the system message) that injects the RRF hybrid baseline's top turns under the same T
  (``select.baselines.baseline_units``, the baseline every harness calls, rendered by
  ``select.workspace.assemble``; costs in the project's tokenizer, as TrawMem's).

Each conversation is one thread: its questions are asked in turn, the messages accumulating as
in a chat. The chat model is a deterministic fake (:class:`Recorder`) that keeps every prompt it
is sent; an innermost probe middleware records the request that reaches the model and the
model's own seconds, an outermost one the whole call, so per model call the benchmark reports
what reached the model: the workspace tokens (the injected block after its header line, counted
with ``trawmem_gpu.tokens``), the evidence recall (share of the question's gold evidence turns
whose ``[turn id]`` line is in the injected block) and the added latency (the call's seconds
less the model's). ``--real URL`` runs the TrawMem and no-memory arms again with an
OpenAI-compatible server (``scripts/real_llm.sh``: llama.cpp) through ``langchain_openai``, or
says why not.

Data: the bundled sample (``trawmem_gpu/data/sample``) by default, or a LoCoMo-layout file
(``--data``, ``--conversations``, ``--questions``). Writes ``agent_loop.json`` and
``agent_loop.png`` under ``benchmarks/results/`` (or ``--out-dir``).

    python -m benchmarks run agent-loop [--budgets 100,200] [--data FILE] [--real URL]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import json
import tempfile
import time
from pathlib import Path

from . import harness

ARMS = ("trawmem", "none", "hybrid")
SYSTEM_PROMPT = "You are a helpful assistant. Answer from the conversation history when it helps."


def _langchain():
    """The LangChain pieces, imported where used (``--help`` stays fast)."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    return create_agent, AgentMiddleware, BaseChatModel, AIMessage, HumanMessage, SystemMessage, ChatGeneration, \
        ChatResult


def make_classes():
    """``(Recorder, Probe, Timer, HybridTopK)``: the fake model and the middlewares (built on
    first use so that importing this module does not import LangChain)."""
    _, AgentMiddleware, BaseChatModel, AIMessage, HumanMessage, SystemMessage, ChatGeneration, ChatResult = \
        _langchain()
    from pydantic import Field

    from trawmem_gpu.integrations.langchain import WORKSPACE_HEADER, message_text

    class Recorder(BaseChatModel):
        """A deterministic fake chat model: answers "Noted." and keeps every message list it is sent."""

        seen: list = Field(default_factory=list)

        @property
        def _llm_type(self) -> str:
            return "recorder"

        def _generate(self, messages, stop=None, run_manager=None, **kw):
            self.seen.append(list(messages))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="Noted."))])

    class Probe(AgentMiddleware):
        """Innermost: the system message that reaches the model, and the model's seconds."""

        def __init__(self):
            super().__init__()
            self.calls: list[dict] = []

        def wrap_model_call(self, request, handler):
            sm = request.system_message
            t0 = time.perf_counter()
            response = handler(request)
            self.calls.append({"system": message_text(sm) if sm is not None else "",
                               "model_s": time.perf_counter() - t0})
            return response

    class Timer(AgentMiddleware):
        """Outermost: the seconds of the whole model call, middlewares included."""

        def __init__(self):
            super().__init__()
            self.calls: list[float] = []

        def wrap_model_call(self, request, handler):
            t0 = time.perf_counter()
            response = handler(request)
            self.calls.append(time.perf_counter() - t0)
            return response

    class HybridTopK(AgentMiddleware):
        """The hybrid baseline as a middleware of TrawMemMiddleware's shape: the latest human
        message's top turns by the RRF hybrid under ``token_budget``, injected after the agent's
        system prompt under the same header. It reads one built bank (``store.Bank``)."""

        def __init__(self, bank, encoder, token_budget: int):
            super().__init__()
            from trawmem_gpu.select.context import BankContext
            from trawmem_gpu.select.params import merge_params

            self.bank, self.encoder = bank, encoder
            self.ctx = BankContext.of(bank)
            self.params = merge_params({"token_budget": token_budget})

        def workspace_text(self, question: str) -> str:
            from trawmem_gpu.select.baselines import baseline_units
            from trawmem_gpu.select.workspace import assemble, headings_for

            z = self.encoder.encode([question], is_query=True)[0]
            units = baseline_units("hybrid", self.ctx, question, z, None, self.params)
            return assemble(self.bank, question, units, headings_for("hybrid", None)).render() if units else ""

        def wrap_model_call(self, request, handler):
            human = next((m for m in reversed(request.messages) if isinstance(m, HumanMessage)), None)
            text = self.workspace_text(message_text(human)) if human is not None else ""
            if text:
                block = f"{WORKSPACE_HEADER}\n{text}"
                sm = request.system_message
                own = message_text(sm) if sm is not None else ""
                request = request.override(system_message=SystemMessage(content=f"{own}\n\n{block}" if own else block))
            return handler(request)

    return Recorder, Probe, Timer, HybridTopK


# ----------------------------------------------------------------------------------------------
# data and banks
# ----------------------------------------------------------------------------------------------
def load_items(data: str | None, n_convs: int | None, n_questions: int | None):
    """``(convs, [(bank_id, qid, question, gold turn ids), ...])`` of the sample or of ``data``."""
    from trawmem_gpu.data import load_conversations, sample_path
    from trawmem_gpu.errors import loads_json

    if data is None:
        convs = load_conversations(sample_path())
        qs = loads_json((sample_path().parent / "sample_questions.json").read_text(encoding="utf-8"))
        items = [(convs[0].bank_id, f"sample-{i}", q["question"], tuple(q["evidence"])) for i, q in enumerate(qs)]
    else:
        convs = load_conversations(harness.require_data(data))
        items = [(c.bank_id, q.qid, q.question, tuple(q.evidence)) for c in convs for q in c.questions if q.evidence]
    if n_convs is not None:
        convs = convs[:n_convs]
    keep = {c.bank_id for c in convs}
    items = [it for it in items if it[0] in keep]
    if n_questions is not None:
        per: dict[str, int] = {}
        items = [it for it in items if per.setdefault(it[0], 0) < n_questions and not per.update({it[0]: per[it[0]] + 1})]
    return convs, items


def build(convs, where: Path):
    """The conversations built into a collection at ``where``: ``(Memory, {bank_id: Bank}, encoder)``;
    the encoder is the shared MiniLM without the embedding cache, so the hybrid arm pays for
    encoding each question as the Memory's selection does."""
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.memory import Memory
    from trawmem_gpu.store import Collection

    coll = Collection(where, create=True)
    banks, _ = build_banks(convs, progress=False)
    coll.put_many(banks)
    # the hybrid encodes each question afresh, as the Memory does (no on-disk embedding cache)
    return Memory(where), {b.bank_id: coll.load(b.bank_id) for b in banks}, get_encoder(cache=False)


# ----------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------
def block_of(system: str) -> str:
    """The injected workspace of a system message: the text after the header line ('' if none)."""
    from trawmem_gpu.integrations.langchain import WORKSPACE_HEADER

    i = system.find(WORKSPACE_HEADER)
    return "" if i < 0 else system[i + len(WORKSPACE_HEADER):].lstrip("\n")


def recall_in(block: str, gold) -> float:
    """Share of the gold turn ids whose ``[id]`` line is in ``block``."""
    return sum(f"[{g}]" in block for g in gold) / len(gold)


def run_arm(arm: str, budget: int, mem, banks: dict, encoder, items, model_factory) -> list[dict]:
    """One arm's agent loop: a thread per conversation, its questions in turn; a record per call."""
    from trawmem_gpu.integrations.langchain import TrawMemMiddleware
    from trawmem_gpu.tokens import count_tokens

    create_agent, *_, HumanMessage, _s, _g, _r = _langchain()
    _, Probe, Timer, HybridTopK = make_classes()
    records: list[dict] = []
    for bank_id in dict.fromkeys(b for b, *_ in items):
        timer, probe = Timer(), Probe()
        memory = {"trawmem": lambda: [TrawMemMiddleware(mem, bank_id=bank_id, token_budget=budget, store=False)],
                  "none": lambda: [],
                  "hybrid": lambda: [HybridTopK(banks[bank_id], encoder, budget)]}[arm]()
        model = model_factory()
        agent = create_agent(model, tools=[], system_prompt=SYSTEM_PROMPT, middleware=[timer, *memory, probe])
        messages: list = []
        for n, (b, qid, question, gold) in enumerate(it for it in items if it[0] == bank_id):
            before = len(probe.calls)
            out = agent.invoke({"messages": messages + [HumanMessage(question, id=f"q-{n}")]},
                               {"configurable": {"thread_id": bank_id}})
            messages = out["messages"]
            for call, total in zip(probe.calls[before:], timer.calls[before:]):
                block = block_of(call["system"])
                records.append({"arm": arm, "budget": budget, "bank_id": bank_id, "qid": qid, "turn": n,
                                "workspace_tokens": count_tokens(block) if block else 0,
                                "evidence_recall": recall_in(block, gold), "gold": list(gold),
                                "added_s": max(0.0, total - call["model_s"]), "model_s": call["model_s"]})
        seen = getattr(model, "seen", None)
        if seen is not None:  # what the fake model got is what the probe saw
            got = [next((m.content for m in s if isinstance(m, _s)), "") for s in seen]
            assert got == [c["system"] for c in probe.calls], "the probe and the model disagree on the prompt"
    return records


def summary(records: list[dict]) -> dict:
    """Per arm: median / mean workspace tokens, mean evidence recall, added latency p50 / p99 (ms)."""
    import numpy as np

    toks = [r["workspace_tokens"] for r in records]
    added = [r["added_s"] * 1e3 for r in records]
    return {"calls": len(records), "workspace_tokens_median": float(np.median(toks)),
            "workspace_tokens_mean": float(np.mean(toks)), "workspace_tokens_max": int(max(toks)),
            "evidence_recall_mean": float(np.mean([r["evidence_recall"] for r in records])),
            "added_ms_p50": harness.pct(added, 50), "added_ms_p99": harness.pct(added, 99)}


def paired(ours: list[dict], theirs: list[dict], n_boot: int) -> dict:
    """TrawMem minus hybrid evidence recall per question, with a paired bootstrap interval:
    whole conversations resampled when there are several (``eval.analyses.cluster_bootstrap``),
    questions when there is one."""
    from trawmem_gpu.eval.analyses import cluster_bootstrap

    key = lambda r: (r["bank_id"], r["qid"])  # noqa: E731
    theirs_by = {key(r): r for r in theirs}
    diffs = [r["evidence_recall"] - theirs_by[key(r)]["evidence_recall"] for r in ours]
    convs = [r["bank_id"] for r in ours]
    clusters = convs if len(set(convs)) > 1 else [r["qid"] for r in ours]
    est, lo, hi = cluster_bootstrap(diffs, clusters, n_boot=n_boot, seed=0)
    return {"trawmem_minus_hybrid": est, "ci95": [lo, hi], "n_boot": n_boot, "questions": len(diffs),
            "resampled": "conversations" if len(set(convs)) > 1 else "questions",
            "better_worse_equal": [sum(d > 0 for d in diffs), sum(d < 0 for d in diffs), sum(d == 0 for d in diffs)]}


def real_model_factory(url: str, model_name: str):
    """A factory of ``langchain_openai.ChatOpenAI`` at ``url``, or ``(None, why)``."""
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        return None, "langchain_openai is not installed: the --real arm is skipped"
    return (lambda: ChatOpenAI(base_url=url, api_key="none", model=model_name, temperature=0, max_tokens=64)), None


def plot(result: dict):
    fig, axes = harness.figure(1, 3, figsize=(13, 3.8))
    budgets = [b["budget"] for b in result["budgets"]]
    width = 0.8 / len(ARMS)
    for k, arm in enumerate(ARMS):
        xs = [i + (k - 1) * width for i in range(len(budgets))]
        for ax, field, label in ((axes[0], "workspace_tokens_median", "workspace tokens (median)"),
                                 (axes[1], "evidence_recall_mean", "evidence recall (mean)"),
                                 (axes[2], "added_ms_p50", "added latency per call, p50 (ms)")):
            ax.bar(xs, [b["arms"][arm][field] for b in result["budgets"]], width, label=arm)
            ax.set_title(label, fontsize=10)
    for ax in axes:
        ax.set_xticks(range(len(budgets)), [f"T={b}" for b in budgets])
    axes[0].legend(fontsize=8)
    fig.suptitle(f"LangChain agent loop, {result['data']}: {result['questions']} questions per arm", fontsize=10)
    fig.tight_layout()
    return fig


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--budgets", default="100,200", help="token budgets T, comma-separated (default 100,200)")
    p.add_argument("--data", default=None, help="a LoCoMo-layout file (default: the bundled sample)")
    p.add_argument("--conversations", type=int, default=None, help="use the first N conversations")
    p.add_argument("--questions", type=int, default=None, help="at most N questions per conversation")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--real", default=None, metavar="URL", help="also run with an OpenAI-compatible server "
                   "(e.g. http://127.0.0.1:8791/v1, scripts/real_llm.sh)")
    p.add_argument("--real-model", default="local", help="the model name sent to --real (default local)")
    p.add_argument("--threads", type=int, default=1, help="thread pools held at N during the loops (default 1)")
    p.add_argument("--out-dir", default=None, help="where to write (default benchmarks/results/)")
    p.add_argument("--name", default="agent_loop", help="result file name (default agent_loop)")
    a = p.parse_args(argv)
    try:
        a.budget_list = [int(x) for x in a.budgets.split(",") if x.strip()]
    except ValueError:
        p.error(f"--budgets: expected integers separated by commas, got {a.budgets!r}")
    if not a.budget_list or min(a.budget_list) < 1:
        p.error(f"--budgets: each token budget must be at least 1, got {a.budgets!r}")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    t_start = time.perf_counter()
    convs, items = load_items(a.data, a.conversations, a.questions)
    Recorder = make_classes()[0]
    result = {"data": a.data or "bundled sample", "conversations": len({b for b, *_ in items}),
              "questions": len(items), "arms": list(ARMS), "store": False, "threads": a.threads, "model": "fake (Recorder)",
              "tokens": "trawmem_gpu.tokens (the project's tokenizer)", "budgets": []}
    with tempfile.TemporaryDirectory(prefix="trawmem-agent-loop-") as tmp:
        t0 = time.perf_counter()
        mem, banks, encoder = build(convs, Path(tmp) / "coll")
        result["build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for bank_id in banks:  # the Memory opens each bank on its first selection: once, outside the loops
            mem.select(bank_id, "warm-up", token_budget=a.budget_list[0])
        result["open_s"] = time.perf_counter() - t0
        with harness.pin_threads(a.threads):
            _loops(a, result, mem, banks, encoder, items, Recorder)
    result["wall_s"] = time.perf_counter() - t_start
    path = harness.save(a.name, result, plot(result), out_dir=a.out_dir)
    print(f"wrote {path}")
    return 0


def _loops(a, result: dict, mem, banks, encoder, items, Recorder) -> None:
    """Every budget's three arms side by side, then the ``--real`` arms; into ``result``."""
    for budget in a.budget_list:
        per = {arm: run_arm(arm, budget, mem, banks, encoder, items, Recorder) for arm in ARMS}
        entry = {"budget": budget, "arms": {arm: summary(r) for arm, r in per.items()},
                 "paired": paired(per["trawmem"], per["hybrid"], a.n_boot),
                 "per_call": [r for arm in ARMS for r in per[arm]]}
        result["budgets"].append(entry)
        s = entry["arms"]
        print(f"T={budget}: " + "; ".join(f"{arm} tokens {s[arm]['workspace_tokens_median']:.0f} recall "
                                          f"{s[arm]['evidence_recall_mean']:.2f} added p50 "
                                          f"{s[arm]['added_ms_p50']:.1f} ms" for arm in ARMS)
              + f"; trawmem-hybrid {entry['paired']['trawmem_minus_hybrid']:+.2f} "
                f"{[round(x, 2) for x in entry['paired']['ci95']]}", flush=True)
    if a.real:
        factory, why = real_model_factory(a.real, a.real_model)
        if factory is None:
            print(f"agent-loop: {why}", flush=True)
            result["real"] = {"url": a.real, "skipped": why}
        else:
            budget = a.budget_list[0]
            result["real"] = {"url": a.real, "budget": budget, "arms": {
                arm: summary(run_arm(arm, budget, mem, banks, encoder, items, factory)) for arm in ARMS}}


if __name__ == "__main__":
    raise SystemExit(main())
