"""Facts that change over time (issue 35.2): does showing current facts instead of every fact put
the current answer in the workspace, at equal tokens, against today's behaviour?

    python -m benchmarks run supersession [--T 400,800,1600] [--llm SPEC] [--out-dir benchmarks/results]

Two sets of questions whose answer changed over the sessions, each found by a rule that reads only
the data's structure (nothing picked by hand):

* **LongMemEval knowledge-update** (the dev slice's ``knowledge-update`` questions): each has two
  or more answer sessions; the *latest* is the one dated last, the others are *stale*.
* **LoCoMo dev, changed answers**: a question (categories 1-4) whose gold evidence lies in two or
  more sessions, and two of LoCoMo's observations citing evidence turns of different sessions
  share a person and are close in meaning (MiniLM cosine >= :data:`SAME_TOPIC`): the same thing
  said again, later. The latest session is the last evidence session; the others are stale.

Workspaces are selected by TrawMem (today's defaults, the question's date) under each token
budget T, by the same engine in every arm:

* ``turns``: today's behaviour (``--units turns``);
* ``turns+facts``: facts beside the turns, every fact shown (no supersession);
* ``turns+facts current``: the same facts with supersession applied, only current facts shown.

Facts per set: LongMemEval has none without an LLM; its arms use **oracle keyed facts** (each gold
turn restated as a fact keyed by the question, valid from its session's date), which measure what
supersession by key can do at best when the extractor finds the right key: an upper bound, not a
result of the method. LoCoMo's facts are its observations (LLM-extracted, keyless): without an
LLM no key exists, so supersession changes nothing (the arm is reported as run); ``--llm SPEC``
lets the LLM propose supersessions session by session (``ingest.layers.supersede.by_llm``).

Metrics per arm and T (means over questions): ``latest``: share of the latest session's gold turns
shown (as turns, or cited by a shown fact); ``stale``: questions whose workspace shows stale gold
evidence; ``stale_only``: stale evidence shown and no latest; ``tokens``. Paired 95% bootstrap
intervals of ``latest`` and ``stale`` against ``turns``. Writes ``supersession.json`` / ``.md`` /
``.png``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import time
from dataclasses import replace

import numpy as np

from . import harness

SAME_TOPIC = 0.6
"""Cosine of two observations (MiniLM) above which LoCoMo's rule takes them as the same topic."""
ARMS = ("turns", "turns+facts", "turns+facts current")


def _fact_vecs(bank, facts, enc):
    from trawmem_gpu.store.view import fact_embed_text

    tb = {t.turn_id: t for t in bank.turns}
    return enc.encode([fact_embed_text(f, tb[f.source_turns[0]].timestamp) for f in facts]).astype(np.float32)


def lme_cases(path, enc):
    """(bank, question, latest gold, stale gold, facts) per knowledge-update question, the facts
    being the oracle keyed restatements of its gold turns."""
    from trawmem_gpu.data.longmemeval import load_longmemeval, session_of
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.store.facts import Fact

    convs = [c for c in load_longmemeval(path) if c.questions and c.questions[0].qtype == "knowledge-update"]
    banks, _ = build_banks(convs, encoder=enc, progress=False)
    out = []
    for c, b in zip(convs, banks):
        q = c.questions[0]
        tb = {t.turn_id: t for t in b.turns}
        by_sess: dict = {}
        for g in q.evidence:
            by_sess.setdefault(session_of(g), []).append(g)
        if len(by_sess) < 2:
            continue
        order = sorted(by_sess, key=lambda s: tb[by_sess[s][0]].time)
        latest, stale = set(by_sess[order[-1]]), {g for s in order[:-1] for g in by_sess[s]}
        facts = [Fact(f"F:{k}", " ".join(tb[g].text.split())[:1000], (g,), persons=("user",),
                      date=tb[g].time.date().isoformat(), subject=q.qid, attribute="answer")
                 for k, g in enumerate(sorted(q.evidence, key=lambda g: tb[g].time))]
        out.append((b, q, latest, stale, facts))
    return out


def locomo_cases(path, enc, llm=None):
    """(bank, question, latest gold, stale gold, facts) per LoCoMo dev question of the rule
    (module docstring); facts: the bank's observations (superseded by the LLM when given)."""
    from trawmem_gpu.data import load_conversations
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.layers.locomo import load_locomo_facts
    from trawmem_gpu.ingest.layers.supersede import SupersedeStats, apply, by_llm

    convs = load_conversations(path)
    banks, _ = build_banks(convs, encoder=enc, progress=False)
    got, _ = load_locomo_facts(path, {b.bank_id: {t.turn_id for t in b.turns} for b in banks})
    out, st = [], SupersedeStats()
    for c, b in zip(convs, banks):
        facts = got.get(b.bank_id, [])
        if not facts:
            continue
        tb = {t.turn_id: t for t in b.turns}
        V = _fact_vecs(b, facts, enc)
        if llm is not None:  # session by session, each session's facts against the ones before
            marked: list = []
            for s in sorted({tb[f.source_turns[0]].session for f in facts}):
                new = [f for f in facts if tb[f.source_turns[0]].session == s]
                marked = list(apply([*marked, *new], by_llm(marked, new, llm, st)))
            facts = marked
        cites = {}
        for i, f in enumerate(facts):
            for t in f.source_turns:
                cites.setdefault(t, []).append(i)
        for q in c.questions:
            if q.category not in (1, 2, 3, 4):
                continue
            ev = [g for g in q.evidence if g in tb]
            sess = sorted({tb[g].session for g in ev})
            if len(sess) < 2:
                continue
            fs = [(i, tb[g].session) for g in ev for i in cites.get(g, [])]
            same = any(sa != sb and set(facts[a].persons) & set(facts[bb].persons)
                       and float(V[a] @ V[bb]) >= SAME_TOPIC for a, sa in fs for bb, sb in fs)
            if not same:
                continue
            out.append((b, q, {g for g in ev if tb[g].session == sess[-1]},
                        {g for g in ev if tb[g].session != sess[-1]}, facts))
    return out, st


def _arm_bank(bank, facts, arm, enc, cache):
    from trawmem_gpu.ingest.layers.supersede import supersede

    if arm == "turns":
        return bank
    key = (bank.bank_id, arm)
    if key not in cache:
        fs = tuple(facts) if arm == "turns+facts current" else tuple(
            replace(f, subject=None, attribute=None, valid_to=None, superseded_by=None) for f in facts)
        if arm == "turns+facts current":
            fs = supersede((), fs).facts
        cache[key] = replace(bank, facts=fs, fact_vecs=_fact_vecs(bank, fs, enc))
    return cache[key]


def run_set(cases, Ts, enc) -> dict:
    """Every arm at every T over ``cases``: per-question scores (for the intervals) and means."""
    from trawmem_gpu.memory.core import served_engine
    from trawmem_gpu.select import client
    from trawmem_gpu.memory.result import SelectedWorkspace
    from trawmem_gpu.select.params import QueryParams

    out: dict = {}
    cache: dict = {}
    Z = enc.encode([q.question for _, q, *_ in cases], is_query=True)
    for arm in ARMS:
        units = ("turns",) if arm == "turns" else ("turns", "facts")
        banks = {b.bank_id: _arm_bank(b, f, arm, enc, cache) for b, _, _, _, f in cases}
        eng = served_engine(banks, units=units)
        for T in Ts:
            qp = QueryParams(budget=None, token_budget=T)
            got = client.select(eng, [client.Request(b.bank_id, q.question, qp, date=q.date) for b, q, *_ in cases], Z=Z)
            rows = []
            for (b, q, latest, stale, _), g in zip(cases, got):
                p = g.units
                ws = SelectedWorkspace.of(g.bank, q.question, p, eng.cfg.headings, g.dated)
                view = eng.bank(b.bank_id)
                shown = set()
                for i in p:
                    t = view.turns[i]
                    shown |= set(getattr(t, "cited_turns", ()) or (t.turn_id,))
                lat = len(shown & latest) / len(latest)
                st = bool(shown & stale)
                rows.append({"latest": lat, "stale": float(st), "stale_only": float(st and not shown & latest),
                             "tokens": ws.tokens})
            out[f"{arm}@{T}"] = rows
    return out


def _ci(a, b, n: int = 2000, seed: int = 0) -> list[float]:
    """Paired bootstrap 95% interval of mean(a - b)."""
    d = np.asarray(a) - np.asarray(b)
    rng = np.random.default_rng(seed)
    m = [float(d[rng.integers(0, len(d), len(d))].mean()) for _ in range(n)]
    return [round(float(np.percentile(m, 2.5)), 4), round(float(np.percentile(m, 97.5)), 4)]


def summarize(per: dict, Ts) -> dict:
    table = {}
    for key, rows in per.items():
        arm, T = key.rsplit("@", 1)
        base = per[f"turns@{T}"]
        rec = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in ("latest", "stale", "stale_only", "tokens")}
        if arm != "turns":
            rec["latest_vs_turns_ci"] = _ci([r["latest"] for r in rows], [r["latest"] for r in base])
            rec["stale_vs_turns_ci"] = _ci([r["stale"] for r in rows], [r["stale"] for r in base])
        table[key] = rec
    return table


def _md(res: dict) -> str:
    lines = ["# Facts that change over time: the current answer at equal tokens", "",
             f"Command: `{res['command']}`. Protocol: `benchmarks/bench_supersession.py` (docstring).", ""]
    for name, part in res["sets"].items():
        lines += [f"## {name}: {part['n_questions']} questions", "", part["note"], "",
                  "| arm | T | latest evidence shown | stale shown | stale only | tokens | latest vs turns (95% CI) |",
                  "|---|---|---|---|---|---|---|"]
        for key, r in part["table"].items():
            arm, T = key.rsplit("@", 1)
            ci = r.get("latest_vs_turns_ci")
            lines.append(f"| {arm} | {T} | {r['latest']:.3f} | {r['stale']:.3f} | {r['stale_only']:.3f} | "
                         f"{r['tokens']:.0f} | {'' if ci is None else f'[{ci[0]:+.3f}, {ci[1]:+.3f}]'} |")
        lines.append("")
    return "\n".join(lines)


def _plot(res: dict, Ts):
    fig, axes = harness.figure(1, len(res["sets"]), figsize=(5.5 * len(res["sets"]), 3.6), squeeze=False)
    for ax, (name, part) in zip(axes[0], res["sets"].items()):
        for arm in ARMS:
            ax.plot(Ts, [part["table"][f"{arm}@{T}"]["latest"] for T in Ts], marker="o", label=arm)
        ax.set_title(f"{name} ({part['n_questions']} q)", fontsize=9)
        ax.set_xlabel("token budget T")
        ax.set_ylabel("latest evidence shown")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--longmemeval", default=str(harness.dev_data("longmemeval")))
    ap.add_argument("--locomo", default=str(harness.dev_data("locomo")))
    ap.add_argument("--T", default="400,800,1600", help="token budgets, comma-separated")
    ap.add_argument("--llm", help="an LLM spec: LoCoMo's supersessions proposed by it (default: none, no LLM)")
    ap.add_argument("--out-dir")
    a = ap.parse_args(argv)
    Ts = [int(x) for x in a.T.split(",")]
    from trawmem_gpu.encode import get_encoder

    enc = get_encoder("minilm")
    t0 = time.perf_counter()
    sets = {}
    lme = lme_cases(harness.require_data(a.longmemeval, "longmemeval", "--longmemeval"), enc)
    sets["LongMemEval-S dev, knowledge-update"] = {
        "n_questions": len(lme), "table": summarize(run_set(lme, Ts, enc), Ts),
        "note": "Facts: oracle keyed restatements of the gold turns (an upper bound on supersession by key; "
                "no LLM-free facts exist for LongMemEval)."}
    llm = None
    if a.llm:
        from trawmem_gpu.llm.factory import llm_from_args

        llm = llm_from_args(a.llm)
    try:
        loc, st = locomo_cases(harness.require_data(a.locomo), enc, llm)
    finally:
        if llm is not None:
            llm.close()
    sets["LoCoMo dev, answers changed over the sessions"] = {
        "n_questions": len(loc), "table": summarize(run_set(loc, Ts, enc), Ts), "supersede": st.to_dict(),
        "note": ("Facts: LoCoMo's observations (keyless). " + (
            f"Supersessions proposed by {a.llm}: {st.superseded}." if a.llm else
            "Without an LLM no observation has a key, so no fact is superseded: 'turns+facts current' is "
            "'turns+facts' (pass --llm to measure the LLM's proposals)."))}
    res = {"T": Ts, "same_topic": SAME_TOPIC, "wall_s": round(time.perf_counter() - t0, 1), "sets": sets,
           "command": harness.command()}
    harness.save("supersession", res, _plot(res, Ts), out_dir=a.out_dir)
    md = _md(res)
    harness.write_text(harness.results_dir(a.out_dir) / "supersession.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
