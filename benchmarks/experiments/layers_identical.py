"""The ingest layers declared once (``store/layers/``, ``ingest/layers/steps.py``; issue 43 item 3)
change no bank: banks built by ``trawmem build`` with the tree before the change (a git worktree of
commit ``--before``) and with this tree, side by side in one run, are compared file by file.

Cases, each built into a fresh collection by each tree (a fresh ``TRAWMEM_CACHE`` per build, the
local fake LLM server of the tests, ``tests/support/llm_server.py`` with ``trimem_fake.respond``):
no layer; ``--facts locomo``; ``--facts llm``; ``--facts llm --profiles llm``; that collection
``--update``d with a second session (the layers' update steps); and a forget of a turn through
``trawmem forget`` (the layers' forget). Every file of each collection is compared byte for byte,
except what differs between any two runs of one tree: in ``meta.json`` the build timings of
``stats`` (keys ending in ``_s``; not under the bank's checksum, ``store/files.py``; the rest of
each ``meta.json``, its ``meta_sha256`` included, is compared as it is), and of the forget's
history (``.history/``) its random key and the events' times and keyed digests (the events
themselves are compared). Saves ``layers_identical.json``.

    python -m benchmarks.experiments.layers_identical [--before e71012e] [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import harness

S1 = [("Ana", "I adopted a beagle called Rex, the answer is beagle."), ("Ben", "Ben likes pottery a lot."),
      ("Ana", "Rex likes the park by the river."), ("Ben", "I made a blue bowl, the answer is blue bowl.")]
S2 = [("Ben", "Ben works at the harbour office now."), ("Ana", "Rex chewed my boots, the answer is boots.")]


def _locomo(path: Path, sessions) -> Path:
    """A LoCoMo-layout file with observations (for ``--facts locomo``)."""
    conv = {"speaker_a": "Ana", "speaker_b": "Ben"}
    obs = {}
    for k, turns in enumerate(sessions, 1):
        conv[f"session_{k}_date_time"] = f"2:14 pm on {k + 1} May, 2031"
        conv[f"session_{k}"] = [{"speaker": s, "dia_id": f"D{k}:{i + 1}", "text": t} for i, (s, t) in enumerate(turns)]
        obs[f"session_{k}_observation"] = {sp: [[f"{sp} said: {t}", f"D{k}:{i + 1}"] for i, (s, t) in
                                                enumerate(turns) if s == sp] for sp in ("Ana", "Ben")}
    path.write_text(json.dumps([{"sample_id": "conv-x", "conversation": conv, "observation": obs, "qa": []}]))
    return path


def _run(tree: Path, args: list, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree), TRAWMEM_CACHE=str(cache), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    r = subprocess.run([sys.executable, "-m", "trawmem_gpu.cli", *args], cwd=tree, env=env, capture_output=True,
                       text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: trawmem {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r


def _files(coll: Path) -> dict[str, bytes]:
    return {str(p.relative_to(coll)): p.read_bytes() for p in sorted(coll.rglob("*")) if p.is_file()}


def _history(b: bytes) -> list:
    """A history file's events less what differs between any two runs: the times and the keyed
    digests (the collection's key is random, ``memory/history.py``)."""
    out = []
    for ln in b.decode().splitlines():
        e = json.loads(ln) if ln.strip() else {}
        out.append({k: ("<digest>" if k.endswith("_digest") else v) for k, v in e.items() if k != "time"})
    return out


def _meta(b: bytes) -> dict:
    m = json.loads(b)
    m["stats"] = {k: v for k, v in (m.get("stats") or {}).items() if not k.endswith("_s")}
    return m


def compare(a: Path, b: Path) -> dict:
    """Every file of collections ``a`` and ``b``: the same names, the same bytes (``meta.json``:
    timings aside)."""
    fa, fb = _files(a), _files(b)
    diff = sorted(set(fa) ^ set(fb))
    same, differ = 0, []
    for name in sorted(set(fa) & set(fb)):
        x, y = fa[name], fb[name]
        if name == ".history/key":  # random per collection
            same += 1
            continue
        if Path(name).name == "meta.json" and x != y:
            x, y = (json.dumps(_meta(v), sort_keys=True).encode() for v in (x, y))
        if name.startswith(".history/") and x != y:
            x, y = (json.dumps(_history(v), sort_keys=True).encode() for v in (x, y))
        if x == y:
            same += 1
        else:
            differ.append(name)
    return {"files": len(set(fa) | set(fb)), "identical": same, "only_in_one": diff, "differ": differ,
            "same": not diff and not differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="e71012e", help="the commit before the change")
    ap.add_argument("--out-dir")
    a = ap.parse_args()
    sys.path.insert(0, str(harness.ROOT / "tests" / "support"))
    from llm_server import LLMServer
    from trimem_fake import respond

    work = Path(tempfile.mkdtemp(prefix="layers_identical-"))
    old = work / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), a.before], cwd=harness.ROOT, check=True,
                   capture_output=True)
    server = LLMServer().start()
    server.responders.append(respond)
    try:
        d1, d2 = _locomo(work / "d1.json", [S1]), _locomo(work / "d2.json", [S1, S2])
        llm = ["--llm", server.base_url]
        cases = {"none": [[]], "facts_locomo": [["--facts", "locomo"]], "facts_llm": [["--facts", "llm", *llm]],
                 "facts_profiles_llm": [["--facts", "llm", "--profiles", "llm", *llm]],
                 "facts_profiles_llm_update_forget": [["--facts", "llm", "--profiles", "llm", *llm],
                                                      ["--update", *llm, "@d2"], ["forget", "conv-x", "D1:4"]],
                 "facts_locomo_update_forget": [["--facts", "locomo"], ["--update", "@d2"],
                                                ["forget", "conv-x", "D1:2"]]}
        out = {}
        for case, steps in cases.items():
            colls = {}
            for name, tree in (("before", old), ("after", harness.ROOT)):
                coll, cache = work / name / case, work / name / f"{case}-cache"
                for step in steps:
                    if step and step[0] == "forget":
                        _run(tree, ["forget", "--collection", str(coll), "--bank", step[1], "--turns", step[2]], cache)
                        continue
                    data = d2 if "@d2" in step else d1
                    _run(tree, ["build", "--input", str(data), "--out", str(coll), "--quiet",
                                *[s for s in step if s != "@d2"]], cache)
                colls[name] = coll
            out[case] = compare(colls["before"], colls["after"])
            print(case, "identical" if out[case]["same"] else f"DIFFERENT {out[case]}", flush=True)
        rec = {"before": a.before, "after": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=harness.ROOT,
                                                            capture_output=True, text=True).stdout.strip()
               + (" (with uncommitted changes)" if subprocess.run(["git", "status", "--porcelain", "trawmem_gpu"],
                                                                 cwd=harness.ROOT, capture_output=True,
                                                                 text=True).stdout.strip() else ""),
               "cases": out, "all_identical": all(c["same"] for c in out.values())}
        print("saved", harness.save("layers_identical", rec, out_dir=a.out_dir))
    finally:
        server.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=harness.ROOT, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
