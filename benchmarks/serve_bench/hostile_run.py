"""``bench_serve.py --hostile``: the default server, then ``--http-workers 2``, each under the
victim / hostile phases of :mod:`.hostile`; one JSON and one PNG."""
from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import shutil
import tempfile
from pathlib import Path

from .. import harness

from .hostile import Spec, hostile_got_4xx, keys_doc, run_phases
from .servers import Server, load_data


def _plot(results: dict):
    fig, ax = harness.figure(1, 1, figsize=(8, 4.5))
    names = list(results)
    xs = range(len(names))
    w = 0.2
    for k, (phase, stat) in enumerate((("unloaded", "p50_ms"), ("loaded", "p50_ms"), ("unloaded", "p99_ms"),
                                      ("loaded", "p99_ms"))):
        ax.bar([x + (k - 1.5) * w for x in xs], [results[n][phase][stat] for n in names], w,
               label=f"{phase} {stat[:3]}")
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("victim latency (ms)")
    ax.set_title("victim single selects, alone and beside the hostile tenant")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def tenants(data: str, prefix: str):
    """The two tenants of a hostile run over ``data``: (collection to copy, the hostile bank, the
    victim's banks, the victim's request bodies, a fresh work folder, the victim's and the hostile
    key, the keys file binding them)."""
    src, banks, items = load_data(data)
    ids = sorted({b.bank_id for b in banks})
    hostile_bank, victim_banks = ids[-1], ids[:-1]
    bodies = [json.dumps({"bank_id": b, "question": q}).encode() for b, q in items if b in victim_banks]
    work = Path(tempfile.mkdtemp(prefix=prefix))
    kv, kh = "tmk_victim_" + secrets.token_hex(8), "tmk_hostile_" + secrets.token_hex(8)
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    keys = work / "keys.json"
    keys.write_text(json.dumps(keys_doc(sha(kv), sha(kh), victim_banks, [hostile_bank])))
    return src, hostile_bank, victim_banks, bodies, work, kv, kh, keys


def bench(a) -> int:
    spec = Spec(victim_rate_hz=a.hostile_rate, phase_s=a.hostile_phase, append_turns=a.hostile_append,
                slow=a.hostile_slow, idle=a.hostile_idle, big_append_turns=a.hostile_big_append)
    src, hostile_bank, victim_banks, bodies, work, kv, kh, keys = tenants(a.data, "trawmem-bench-hostile-")
    results = {}
    try:
        for name, extra in (("default", []), ("http-workers-2", ["--http-workers", "2"])):
            srv = Server(name, src, work, a, 0, 0.0, flags=["--keys", str(keys), *extra, *a.hostile_flags.split()])
            try:
                srv.wait_ready()
                r = asyncio.run(run_phases(srv.port, kv, bodies, kh, hostile_bank, spec, tag=name))
                import httpx

                info = httpx.get(f"{srv.url}/v1/banks/{hostile_bank}", headers={"Authorization": f"Bearer {kh}"},
                                 timeout=60).json()
                r["hostile_bank_units_after"] = info.get("n_units")
                r["hostile_got_4xx"] = hostile_got_4xx(r)
                results[name] = r
                u, lo = r["unloaded"], r["loaded"]
                print(f"{name}: victim unloaded p50 {u['p50_ms']:.1f} p99 {u['p99_ms']:.1f} ms ({u['errors']} errors "
                      f"of {u['n']}); loaded p50 {lo['p50_ms']:.1f} p99 {lo['p99_ms']:.1f} ms ({lo['errors']} errors "
                      f"of {lo['n']}); p99 ratio {r['p99_loaded_over_unloaded']:.2f}; append "
                      f"{r['hostile']['append']}; hostile 4xx {r['hostile_got_4xx']}", flush=True)
                print("  hostile:", json.dumps(r["hostile"]), flush=True)
                if r["append_phase"]:
                    ap = r["append_phase"]
                    print(f"  append phase: {ap['append']}; victim p50 {ap['victim']['p50_ms']:.1f} p99 "
                          f"{ap['victim']['p99_ms']:.1f} ms, {ap['victim']['errors']} errors of {ap['victim']['n']}",
                          flush=True)
            finally:
                srv.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    target = {n: {"victim_errors": r["unloaded"]["errors"] + r["loaded"]["errors"]
                  + (r["append_phase"]["victim"]["errors"] if r["append_phase"] else 0),
                  "victim_unloaded_p50_p99_ms": (r["unloaded"]["p50_ms"], r["unloaded"]["p99_ms"]),
                  "victim_loaded_p50_p99_ms": (r["loaded"]["p50_ms"], r["loaded"]["p99_ms"]),
                  "p99_ratio": r["p99_loaded_over_unloaded"],
                  "p99_within_3x": bool(r["p99_loaded_over_unloaded"] is not None
                                        and r["p99_loaded_over_unloaded"] <= 3.0),
                  "append_turns_per_s_under_attack": (r["hostile"]["append"] or {}).get("turns_per_s"),
                  "big_append": r["append_phase"] and {
                      "turns_per_s": r["append_phase"]["append"]["turns_per_s"],
                      "status": r["append_phase"]["append"]["status"],
                      "victim_p50_p99_ms": (r["append_phase"]["victim"]["p50_ms"],
                                            r["append_phase"]["victim"]["p99_ms"])}}
              for n, r in results.items()}
    res = {"machine": harness.machine(), "args": vars(a), "n_banks": len(banks), "victim_banks": victim_banks,
           "hostile_bank": hostile_bank, "results": results, "targets": target}
    path = harness.save(a.name if a.name != "serve" else "serve_hostile", res, _plot(results), out_dir=a.out_dir,
                        dpi=120)
    print("targets:", json.dumps(target, indent=1))
    print(f"-> {path}, {path.with_suffix('.png')}")
    ok = all(t["victim_errors"] == 0 for t in target.values()) and all(r["hostile_got_4xx"] for r in results.values())
    return 0 if ok else 1
