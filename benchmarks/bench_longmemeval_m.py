"""A LongMemEval-M-style run (issue 33.6): haystacks of about 500 sessions made from the dev slice's
own sessions, quality at equal tokens against the RRF hybrid and per-query latency, beside the
S-sized haystacks of the same questions, in one run.

    python -m benchmarks run longmemeval_m [--data PATH] [--sessions 500] [--token-budgets 400,800,1600]
        [--questions N] [--latency-sample 40]

**The M haystacks** (``make_m``; the official M set is ~500 sessions per question, drawn from the
same kinds of sessions as S; this is the closest the dev slice allows, and its method is written
here and in ``docs/scaling.md``):

* the pool is every session of every haystack of the dev slice (150 questions, ~50 sessions
  each), one copy per session id, with the date and turns of its first placement;
* question ``q``'s haystack is its own S haystack (every session, its answer sessions included,
  as given) plus sessions of the pool it does not hold, dated no later than ``q``'s question
  date (nothing from ``q``'s future), drawn at random (seeded by ``q``'s id) until it holds
  ``--sessions`` sessions, then ordered by date (ties: S haystack order first, then pool order);
* a pool session that is another question's answer session has ``answer`` in its id replaced by
  ``filler`` and its ``has_answer`` marks dropped: it is a distractor here, and the official
  metrics read gold from the ids (``data.longmemeval``);
* the file is written in the LongMemEval format to the trawmem cache directory
  (``TRAWMEM_CACHE``, default ``~/.cache/trawmem_gpu/``, never under the repository), and banks are
  built from it as ``trawmem score`` builds any LongMemEval file (user turns, default config,
  cached by the file's digest).

**Quality**: cosine, BM25, the RRF hybrid (k = 60) and TrawMem (defaults), each at equal context
tokens (``QueryParams.token_budget``, no unit cap), on M and on S: official metrics, evidence
recall macro over question types, context tokens (cl100k_base), and TrawMem minus the hybrid with
a paired bootstrap (95% interval, stratified by question type). The shipped affinity weights were
fitted on both dev sets (S haystacks), so the margin is not held out; the S-to-M change at fixed
methods is the comparison this run makes.

**Latency**: one query at a time (selection only, question vectors given), TrawMem and the hybrid,
over ``--latency-sample`` questions, M and S interleaved; medians and p95.

Banks are evaluated in chunks of ``--chunk`` questions (one engine per chunk), so memory stays
bounded. Writes ``longmemeval_m.json``, ``.md`` and ``.png``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import gzip
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

from . import harness

METHODS = ("cosine", "bm25", "hybrid", "trawmem")


def _parse_date(s: str):
    from trawmem_gpu.data.dates import parse_date

    return parse_date(s)


def make_m(raw: list[dict], sessions: int) -> list[dict]:
    """The M instances of the S instances ``raw`` (see the module docstring)."""
    import numpy as np

    pool: dict[str, tuple] = {}
    for inst in raw:
        for sid, date, sess in zip(inst["haystack_session_ids"], inst["haystack_dates"], inst["haystack_sessions"]):
            pool.setdefault(sid, (date, sess))
    order = list(pool)
    when = {sid: _parse_date(pool[sid][0]) for sid in order}
    out = []
    for inst in raw:
        now = _parse_date(inst["question_date"])
        own = list(inst["haystack_session_ids"])
        held = set(own)
        cand = [s for s in order if s not in held and when[s] <= now]
        seed = int.from_bytes(hashlib.sha256(inst["question_id"].encode()).digest()[:8], "little")
        take = max(0, sessions - len(own))
        pick = sorted(np.random.default_rng(seed).choice(len(cand), size=min(take, len(cand)), replace=False).tolist())
        rows = [(i, sid, d, s) for i, (sid, d, s) in enumerate(zip(own, inst["haystack_dates"], inst["haystack_sessions"]))]
        for k, j in enumerate(pick):
            sid = cand[j]
            d, s = pool[sid]
            if "answer" in sid:  # another question's answer session: a distractor here
                sid = sid.replace("answer", "filler")
                s = [{kk: vv for kk, vv in t.items() if kk != "has_answer"} for t in s]
            rows.append((len(own) + k, sid, d, s))
        rows.sort(key=lambda r: (_parse_date(r[2]), r[0]))
        out.append({**inst, "haystack_session_ids": [r[1] for r in rows], "haystack_dates": [r[2] for r in rows],
                    "haystack_sessions": [r[3] for r in rows]})
    return out


def _spec(method: str, T: int):
    from trawmem_gpu.score import ScoreSpec
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    return ScoreSpec(method=method, select={**SelectConfig().to_dict(), **QueryParams(token_budget=T).to_dict()},
                     ks=(1, 3, 5, 10, 30, 50))


def evaluate(bank_dir: Path, convs, items, Z, token_budgets, chunk: int, enc, log) -> dict:
    """Records of every method at every T, chunk by chunk of questions (one engine per chunk)."""
    from trawmem_gpu.score import Scorer
    from trawmem_gpu.store import Collection

    coll = Collection(bank_dir)
    by_bank = {it.bank_id: i for i, it in enumerate(items)}
    recs = {(m, T): [] for m in METHODS for T in token_budgets}
    t0 = time.perf_counter()
    for s in range(0, len(convs), chunk):
        part = convs[s:s + chunk]
        banks = [coll.load(c.bank_id) for c in part]
        idx = [by_bank[c.bank_id] for c in part if c.bank_id in by_bank]
        its, z = [items[i] for i in idx], Z[idx]
        ctxs: dict = {}
        for m in METHODS:
            for T in token_budgets:
                sc = Scorer(banks, _spec(m, T), encoder=enc, contexts=ctxs)
                recs[(m, T)] += [r["eval"] for r in sc.score(its, z)]
        log(f"    {s + len(part)}/{len(convs)} questions scored ({time.perf_counter() - t0:.0f} s)")
    return recs


def bootstrap(ours: list[dict], theirs: list[dict], n_boot: int = 10_000, seed: int = 0) -> dict:
    """Paired bootstrap of the macro evidence-recall margin (ours - theirs), stratified by question type."""
    import numpy as np

    from trawmem_gpu.eval.longmemeval import scored

    a = {r["qid"]: r for r in scored(ours)}
    b = {r["qid"]: r for r in scored(theirs)}
    types = sorted({r["qtype"] for r in a.values()})
    diffs = {t: np.array([a[q]["evidence_recall"] - b[q]["evidence_recall"] for q in a if a[q]["qtype"] == t and q in b])
             for t in types}
    rng = np.random.default_rng(seed)
    boot = np.mean([d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1) for d in diffs.values()], axis=0)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"margin": float(np.mean([d.mean() for d in diffs.values()])), "ci95": [float(lo), float(hi)],
            "p_above_0": float((boot > 0).mean())}


def latency(bank_dirs: dict, convs: dict, items: dict, Z: dict, n: int, T: int, enc) -> dict:
    """Selection latency, one query at a time, TrawMem and the hybrid, on each haystack size in turn
    per question (interleaved), over the first ``n`` questions."""
    import numpy as np

    from trawmem_gpu.score import Scorer
    from trawmem_gpu.store import Collection

    out = {}
    scorers = {}
    for size in bank_dirs:
        coll = Collection(bank_dirs[size])
        banks = [coll.load(c.bank_id) for c in convs[size][:n]]
        for m in ("trawmem", "hybrid"):
            scorers[(size, m)] = Scorer(banks, _spec(m, T), encoder=enc)
    times = {k: [] for k in scorers}
    for i in range(min(n, len(items["S"]))):
        for key, sc in scorers.items():
            it, z = items[key[0]][i], Z[key[0]][i:i + 1]
            sc.select([it], z)  # warm (context, caches) then timed
            t0 = time.perf_counter()
            sc.select([it], z)
            times[key].append(time.perf_counter() - t0)
    for (size, m), ts in times.items():
        out.setdefault(size, {})[m] = {"p50_ms": round(float(np.median(ts)) * 1e3, 2),
                                       "p95_ms": round(float(np.percentile(ts, 95)) * 1e3, 2), "n": len(ts)}
    return out


def load_size(path: Path, enc, log, name: str):
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.ingest.cache import build_identity, default_bank_dir, ensure_collection
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.score.items import items_from_conversations

    convs = load_longmemeval(path)
    ident = build_identity(file_sha256(path), BuildConfig(), "user")
    bank_dir = default_bank_dir(ident)
    t0 = time.perf_counter()
    build = ensure_collection(convs, bank_dir, ident, BuildConfig(), encoder=enc, progress=True)
    log(f"  {name}: {len(convs)} banks, {sum(len(c.turns) for c in convs)} units, build {time.perf_counter() - t0:.0f} s")
    items = items_from_conversations(convs)
    Z = enc.encode([it.question for it in items], is_query=True)
    sizes = [len(c.turns) for c in convs]
    return convs, items, Z, bank_dir, {"banks": len(convs), "units_mean": statistics.mean(sizes),
                                       "units_max": max(sizes), "build": build}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_longmemeval_m.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(harness.dev_data("longmemeval")))
    ap.add_argument("--sessions", type=int, default=500, help="sessions per M haystack")
    ap.add_argument("--token-budgets", default="400,800,1600")
    ap.add_argument("--questions", type=int, default=0, help="the first N questions only (0: all)")
    ap.add_argument("--chunk", type=int, default=10, help="questions per engine while scoring")
    ap.add_argument("--latency-sample", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--name", default="longmemeval_m")
    a = ap.parse_args(argv)
    data = harness.require_data(a.data, "longmemeval")
    Ts = [int(x) for x in a.token_budgets.split(",") if x.strip()]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.longmemeval import aggregate_lme
    from trawmem_gpu.paths import default_cache_dir

    with harness.pin_threads(a.threads):
        raw = json.loads(gzip.open(data, "rt", encoding="utf-8").read())
        if a.questions:
            raw = raw[:a.questions]
        m = make_m(raw, a.sessions)
        mdir = default_cache_dir() / "longmemeval_m"
        mdir.mkdir(parents=True, exist_ok=True)
        mpath = mdir / f"lme_m{a.sessions}_{hashlib.sha256(Path(data).read_bytes()).hexdigest()[:12]}_{len(raw)}.json.gz"
        if not mpath.exists():
            with gzip.open(mpath, "wt", encoding="utf-8") as f:
                json.dump(m, f)
        spath = Path(data) if not a.questions else mdir / f"lme_s_{len(raw)}.json.gz"  # all: the file itself
        if not spath.exists():
            with gzip.open(spath, "wt", encoding="utf-8") as f:
                json.dump(raw, f)
        enc = get_encoder()
        rec = {"benchmark": "longmemeval_m", "command": harness.command(), "sessions": a.sessions,
               "token_budgets": Ts, "method": (__doc__ or "").split("**The M haystacks**")[1].split("**Quality**")[0].strip()}
        state = {}
        for size, path in (("S", spath), ("M", mpath)):
            convs, items, Z, bdir, info = load_size(path, enc, log, size)
            rec.setdefault("haystacks", {})[size] = {**info, "sessions_mean": statistics.mean(
                len({t.session for t in c.turns}) for c in convs)}
            recs = evaluate(bdir, convs, items, Z, Ts, a.chunk, enc, log)
            rec.setdefault("quality", {})[size] = [{"method": mth, "token_budget": T, **aggregate_lme(r)}
                                                   for (mth, T), r in recs.items()]
            rec.setdefault("margin", {})[size] = {str(T): bootstrap(recs[("trawmem", T)], recs[("hybrid", T)])
                                                  for T in Ts}
            state[size] = (convs, items, Z, bdir)
        rec["latency"] = latency({s: v[3] for s, v in state.items()}, {s: v[0] for s, v in state.items()},
                                 {s: v[1] for s, v in state.items()}, {s: v[2] for s, v in state.items()},
                                 a.latency_sample, Ts[len(Ts) // 2], enc)
        rec["machine"] = harness.machine(threads=a.threads)
    md = markdown(rec)
    print(md)
    out = harness.save(a.name, rec, figure(rec), out_dir=a.out_dir)
    harness.write_text(out.with_suffix(".md"), md)
    print(f"-> {out}")
    return 0


def markdown(rec: dict) -> str:
    lines = [f"# LongMemEval-M-style run ({rec['sessions']} sessions per haystack) beside S", "",
             f"Command: `{rec['command']}`", "", "## How the M haystacks are made", "", rec["method"], "",
             "## Quality at equal context tokens (macro evidence recall over question types)", "",
             "| haystack | units / bank | T | " + " | ".join(METHODS) + " | TrawMem - hybrid [95% CI] |",
             "|---|---|---|" + "---|" * len(METHODS) + "---|"]
    for size, rows in rec["quality"].items():
        units = rec["haystacks"][size]["units_mean"]
        for T in rec["token_budgets"]:
            by = {r["method"]: r for r in rows if r["token_budget"] == T}
            mg = rec["margin"][size][str(T)]
            lines.append(f"| {size} | {units:.0f} | {T} | " + " | ".join(
                f"{by[m]['macro']['evidence_recall']:.3f}" for m in METHODS) +
                f" | {mg['margin'] * 100:+.1f} [{mg['ci95'][0] * 100:+.1f}, {mg['ci95'][1] * 100:+.1f}] |")
    lines += ["", "## Latency per query (selection only, one at a time)", "",
              "| haystack | method | p50 ms | p95 ms |", "|---|---|---|---|"]
    for size, ms in rec["latency"].items():
        for m, v in ms.items():
            lines.append(f"| {size} | {m} | {v['p50_ms']} | {v['p95_ms']} |")
    return "\n".join(lines) + "\n"


def figure(rec: dict):
    fig, ax = harness.figure(1, 2, figsize=(12, 4.5))
    for i, (size, rows) in enumerate(rec["quality"].items()):
        for j, m in enumerate(METHODS):
            rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["token_budget"])
            ax[0].plot([r["macro"]["context_tokens"] for r in rs], [r["macro"]["evidence_recall"] for r in rs],
                       "o-" if size == "M" else "s--", color=f"C{j}", label=f"{m} ({size})")
    ax[0].set(xlabel="context tokens", ylabel="macro evidence recall", title="equal tokens: S (dashed) and M (solid)")
    ax[0].legend(fontsize=7)
    names = [f"{m} {s}" for s in rec["latency"] for m in rec["latency"][s]]
    ax[1].bar(names, [rec["latency"][s][m]["p50_ms"] for s in rec["latency"] for m in rec["latency"][s]])
    ax[1].set(ylabel="ms per query (p50)", title="selection latency")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
