"""Each LLM path on the bundled sample conversation (33 turns, 3 sessions), by the code of one tree.

The paths, as a new user with a local model runs them (each with a fresh LLM reply cache, so the
model answers every request): ``build --segmentation llm --heads llm``; ``build --facts llm
--profiles llm``; ``build --update`` of that bank with a new session; ``query --method trawmem
--plan-llm --follow-up`` and ``query --method trimem --plan-llm`` for two sample questions;
``Memory(plan_llm=...)`` for the same two; ``eval --answer-llm --judge-llm`` at T = 800 on the
sample's four questions; and one ``evolve-prompts`` step. Each runs under ``driver.py`` (every
request and reply recorded) and is read back by ``analyze.py``; the banks it built are read for
what was stored (heads, facts) and what the checks refuse among it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW_SESSION = [("Ana", "I booked the train to Lisbon for the October marathon."),
               ("Ben", "Great! I will come and cheer for you at the finish line."),
               ("Ana", "Clara said she might join us from Rotterdam with Pixel."),
               ("Ben", "Then we need a flat that allows cats.")]


def _sample_files(work: Path) -> dict:
    """The sample as JSONL, a new fourth session for the update, and the sample in LoCoMo's
    layout (its questions, turn ids ``D<session>:<n>``) for ``eval`` and ``evolve-prompts``."""
    from trawmem_gpu.data import sample_path

    sample = Path(sample_path())
    rows = [json.loads(x) for x in sample.read_text(encoding="utf-8").splitlines() if x.strip()]
    new = work / "session4.jsonl"
    new.write_text("".join(json.dumps({"bank_id": "ana-ben", "turn_id": f"S4:{i + 1}", "speaker": s, "text": t,
                                       "timestamp": "2024-05-02T09:00:00"}) + "\n"
                           for i, (s, t) in enumerate(NEW_SESSION)), encoding="utf-8")
    days = sorted({r["timestamp"][:10] for r in rows})
    conv = {"speaker_a": "Ana", "speaker_b": "Ben"}
    for k, day in enumerate(days, 1):
        rs = [r for r in rows if r["timestamp"][:10] == day]
        t = rs[0]["timestamp"]
        conv[f"session_{k}_date_time"] = f"{t[11:16]} on {int(t[8:10])} {_month(t)}, {t[:4]}"
        conv[f"session_{k}"] = [{"speaker": r["speaker"], "dia_id": r["turn_id"].replace("S", "D", 1),
                                 "text": r["text"]} for r in rs]
    qs = json.loads((sample.parent / "sample_questions.json").read_text(encoding="utf-8"))
    qa = [{**q, "evidence": [e.replace("S", "D", 1) for e in q["evidence"]]} for q in qs]
    loco = work / "sample_locomo.json"
    loco.write_text(json.dumps([{"sample_id": "ana-ben", "conversation": conv, "qa": qa}]), encoding="utf-8")
    return {"jsonl": sample, "new": new, "locomo": loco, "questions": [q["question"] for q in qs][:2]}


def _month(iso: str) -> str:
    import calendar

    return calendar.month_name[int(iso[5:7])]


def _commands(files: dict, w: Path, url: str, llm_flags: list[str]) -> list[tuple[str, str, list]]:
    """(path id, path name, [(how, args), ...]) of every path, in order (``update`` and
    ``plan-trimem`` read the bank of ``facts``)."""
    q1, q2 = files["questions"]
    qry = lambda bank, q, *more: ("cli", ["query", "--bank", str(bank), "--question", q, "--json", *more])  # noqa
    mem = ("from trawmem_gpu import Memory\nfrom trawmem_gpu.llm.factory import llm_from_args\n"
           f"llm = llm_from_args({url!r}, check=True)\nmem = Memory({str(w / 'plain')!r}, plan_llm=llm)\n"
           f"for q in {[q1, q2]!r}:\n    ws = mem.select('ana-ben', q)\n    print(q, '->', ws.searches)\n")
    return [
        ("segment", "segment + heads", [("cli", ["build", "--input", str(files["jsonl"]), "--out", str(w / "segheads"),
                                      "--segmentation", "llm", "--heads", "llm", "--llm", url, "--quiet", *llm_flags])]),
        ("facts", "facts + profiles", [("cli", ["build", "--input", str(files["jsonl"]), "--out", str(w / "facts"), "--facts",
                                       "llm", "--profiles", "llm", "--llm", url, "--quiet", *llm_flags])]),
        ("update", "update (facts + profiles)", [("cli", ["build", "--input", str(files["new"]), "--out", str(w / "facts"),
                                                "--update", "--llm", url, "--quiet", *llm_flags])]),
        ("plan-trawmem", "plan: trawmem --plan-llm --follow-up", [qry(w / "plain", q, "--method", "trawmem", "--plan-llm", url,
                                                     "--follow-up", *llm_flags) for q in (q1, q2)]),
        ("plan-trimem", "plan: trimem --plan-llm", [qry(w / "facts", q, "--method", "trimem", "--plan-llm", url, *llm_flags)
                                     for q in (q1, q2)]),
        ("memory", "Memory(plan_llm=...)", [("python", [mem])]),
        ("eval", "eval: answers + judge (T=800)", [("cli", ["eval", "--data", str(files["locomo"]), "--method", "trawmem",
                                                    "--token-budget", "800", "--answer-llm", url, "--judge-llm", url,
                                                    "--output", str(w / "eval.json"), "--allow-failures", "100",
                                                    *llm_flags])]),
        ("evolve", "evolve-prompts (1 step)", [("cli", ["evolve-prompts", "--data", str(files["locomo"]), "--llm", url,
                                              "--steps", "1", "--max-failures", "2", "--out", str(w / "evolve"),
                                              *llm_flags])]),
    ]


def _outputs(name: str, w: Path) -> list[Path]:
    """What path ``name`` writes (removed before it runs; the update appends to the facts path's bank)."""
    return {"segment + heads": [w / "segheads"], "facts + profiles": [w / "facts"],
            "eval: answers + judge (T=800)": [w / "eval.json"], "evolve-prompts (1 step)": [w / "evolve"]}.get(name, [])


def _idle(url: str, limit_s: float = 3600.0) -> None:
    """Wait until the server is idle: an earlier run's abandoned requests may still be running
    there (llama.cpp's server answers ``GET /models`` only between completions)."""
    if not url.startswith("http"):
        return
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/models", timeout=limit_s)
    except httpx.HTTPError:
        pass


def _run(tree: Path, record: Path, how: str, args: list, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "TRAWMEM_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    p = subprocess.run(["nice", "-n", "5", sys.executable, str(HERE / "driver.py"), str(record), how, *args],
                       env=env, capture_output=True, text=True)
    lines = [x for x in (p.stdout + p.stderr).splitlines() if x.strip() and "it/s]" not in x]
    return {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 1), "tail": lines[-6:]}


def _stored(w: Path, name: str) -> dict:
    """What the path's bank holds: heads (LLM-written or fallen back) and facts, each with the
    reason the checks would refuse it (None: they pass), and the bank's own fallback record."""
    from trawmem_gpu.ingest.layers.trimem_extract import cited_texts
    from trawmem_gpu.llm.grounding import fact_problem, head_problem
    from trawmem_gpu.llm.prompts import HEAD
    from trawmem_gpu.store import Collection

    d = w / ("segheads" if name.startswith("segment") else "facts")
    try:
        bank = Collection(d).load("ana-ben")
    except Exception as e:  # noqa: BLE001 - a path that failed leaves no bank
        return {"bank": f"none ({type(e).__name__})"}
    off = [int(x) for x in bank.thread_offsets]
    out = {"threads": bank.n_threads, "thread_lengths": [b - a for a, b in zip(off, off[1:])],
           "llm_fallbacks": (bank.stats or {}).get("llm_fallbacks")}
    if name.startswith("segment"):
        out["heads"] = [{"kind": k, "head": h, "check": head_problem(h, [t.embed_text() for t in bank.turns[a:b]],
                                                                     HEAD.template) if k == "llm" else None}
                        for h, k, a, b in zip(bank.heads, bank.head_kind, off, off[1:])]
    else:
        by = {t.turn_id: t for t in bank.turns}
        out["facts"] = [{"fact": f.text, "cites": list(f.source_turns),
                         "check": fact_problem(f.text, cited_texts([by[s] for s in f.source_turns if s in by]))}
                        for f in bank.facts]
        out["profile_lines"] = sum(len(s.lines) for s in bank.profiles)
    return out


def main_paths(args) -> dict:
    """Run every path (or ``--only``) for ``args.label``; the record to merge into the results."""
    from .analyze import summarize

    import shutil

    tree = Path(args.tree)
    w = Path(args.work) / "paths" / args.label
    w.mkdir(parents=True, exist_ok=True)
    files = _sample_files(w)
    supports = "--llm-constrain" in (tree / "trawmem_gpu" / "cli" / "args.py").read_text(encoding="utf-8")
    flags = ["--llm-constrain", args.constrain] if supports else []
    if not (w / "plain").exists():
        subprocess.run([sys.executable, "-m", "trawmem_gpu.cli", "build", "--input", str(files["jsonl"]), "--out",
                        str(w / "plain"), "--quiet"], env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
                       capture_output=True)
    only = set(args.only.split(",")) if args.only else None
    paths = {}
    for k, (pid, name, steps) in enumerate(_commands(files, w, args.url, flags)):
        if only and pid not in only:
            continue
        record, cache = w / f"{k:02d}.jsonl", w / f"cache{k:02d}"  # fresh: the model answers every request
        record.unlink(missing_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        for made in _outputs(name, w):
            shutil.rmtree(made, ignore_errors=True) if made.is_dir() else made.unlink(missing_ok=True)
        _idle(args.url)
        runs = [_run(tree, record, how, a, cache) for how, a in steps]
        paths[name] = {"rc": max(r["rc"] for r in runs), "seconds": round(sum(r["seconds"] for r in runs), 1),
                       "runs": len(runs), "output": [ln for r in runs for ln in r["tail"]], **summarize(record)}
        if name.startswith(("segment", "facts", "update")):
            paths[name]["stored"] = _stored(w, name)
        print(f"{args.label}: {name}: rc {paths[name]['rc']}, {paths[name]['seconds']}s", flush=True)
    return {"tree": str(tree), "constrain": args.constrain if supports else "(no such flag: JSON mode)",
            "model": args.model, "paths": paths}
