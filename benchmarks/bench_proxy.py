"""The chat-completions proxy's added latency (issue 44 item 1): ``POST /v1/chat/completions``
through ``trawmem serve --upstream`` against the same request sent to the upstream directly,
side by side in one run.

Upstreams: the fake OpenAI-compatible server of the test suite (``tests/support/fake_upstream.py``,
a real HTTP server on 127.0.0.1 answering at once, so the difference is the proxy's own cost:
the key, the workspace selection through the batcher, placing it, ``/tokenize``, the forward and
the background append) at ``--conc`` concurrent clients, and the same fake without ``/tokenize``
at ``--bare-conc`` clients (the cost less the count's call); and, with ``--real URL`` (the llama.cpp
server of ``scripts/real_llm.sh``), the real model at one client (``--real-conc``), where the
placed workspace also lengthens the prompt the model reads. The server holds the bundled sample
(bank ``ana-ben``); every request asks the same question, so after the first exchange each
background append is a retry (found held, nothing rebuilt).

Per cell (upstream x concurrency), each round sends ``--requests`` requests directly and as many
through the proxy, the order of the two alternating from round to round; a request's latency is
the client's (closed loop: each client sends its next request when its last is answered). Per
side: p50 and p99 over the round's requests; the proxy's added latency is the difference of the
two sides' p50 (and p99) within the round, its median over rounds reported with the range.
Writes ``proxy.json`` and ``proxy.png`` under ``benchmarks/results/`` (or ``--out-dir`` /
``TRAWMEM_BENCH_OUT``).

    python -m benchmarks run proxy [--conc 1,16,64] [--bare-conc 1] [--requests 128] [--rounds 5] [--real URL]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import statistics
import time

from . import harness

QUESTION = "Why did Ana walk home during her long run?"
BANK = "ana-ben"


def _body(model: str, max_tokens: int | None) -> dict:
    body = {"model": model, "user": BANK, "temperature": 0,
            "messages": [{"role": "system", "content": "Answer in one short sentence."},
                         {"role": "user", "content": QUESTION}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def _cell(url: str, body: dict, conc: int, n: int, timeout_s: float) -> dict:
    """``n`` requests to ``url`` from ``conc`` closed-loop clients: latencies (s) and failures."""
    import asyncio

    import httpx

    lat, failed, left = [], [0], [n]
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as c:
        async def client():
            while left[0] > 0:
                left[0] -= 1
                t0 = time.perf_counter()
                try:
                    r = await c.post(url, json=body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    failed[0] += 1

        await asyncio.gather(*(client() for _ in range(conc)))
    return {"lat": lat, "failed": failed[0]}


def _side(cell: dict) -> dict:
    lat = cell["lat"]
    return {"p50_ms": harness.pct(lat, 50) * 1e3 if lat else None, "p99_ms": harness.pct(lat, 99) * 1e3 if lat else None,
            "n": len(lat), "failed": cell["failed"]}


def measure(direct: str, proxied: str, body: dict, conc: int, n: int, rounds: int, timeout_s: float) -> dict:
    """One cell: per round the direct and proxied sides (alternating first), then the medians."""
    import asyncio

    per_round = []
    for r in range(rounds):
        order = (("direct", direct), ("proxy", proxied)) if r % 2 == 0 else (("proxy", proxied), ("direct", direct))
        got = {side: _side(asyncio.run(_cell(url, body, conc, n, timeout_s))) for side, url in order}
        ok = all(got[s]["p50_ms"] is not None for s in got)
        got["added_p50_ms"] = got["proxy"]["p50_ms"] - got["direct"]["p50_ms"] if ok else None
        got["added_p99_ms"] = got["proxy"]["p99_ms"] - got["direct"]["p99_ms"] if ok else None
        per_round.append(got)

    def summary(key, side=None):
        xs = [(x[side][key] if side else x[key]) for x in per_round]
        xs = [x for x in xs if x is not None]
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None

    return {"conc": conc, "requests_per_side": n, "rounds": per_round,
            "direct_p50_ms": summary("p50_ms", "direct"), "direct_p99_ms": summary("p99_ms", "direct"),
            "proxy_p50_ms": summary("p50_ms", "proxy"), "proxy_p99_ms": summary("p99_ms", "proxy"),
            "added_p50_ms": summary("added_p50_ms"), "added_p99_ms": summary("added_p99_ms"),
            "failed": sum(x["direct"]["failed"] + x["proxy"]["failed"] for x in per_round)}


def _server(collection: str, upstream: str, threads: int):
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.server import BackgroundServer, build_app

    cfg = ServeConfig(collection=collection, upstream=upstream, threads=threads, max_wait_ms=1, timeout_s=600,
                      upstream_timeout_s=600, max_connections=4096)
    app, _ = build_app(cfg)
    return BackgroundServer(app, cfg)


def _metric_lines(url: str) -> list[str]:
    import httpx

    return [ln for ln in httpx.get(url + "/metrics", timeout=60).text.splitlines()
            if ln.startswith(("trawmem_proxy_requests_total", "trawmem_proxy_appends_total",
                              "trawmem_proxy_workspace_tokens_sum", "trawmem_proxy_workspace_tokens_count"))]


def run(args) -> dict:
    import tempfile
    from pathlib import Path

    build_sample_collection = harness.tests_module("serve_util").build_sample_collection
    FakeUpstream = harness.tests_module("fake_upstream").FakeUpstream
    t_start = time.perf_counter()
    rec = {"what": "the chat-completions proxy's added latency over the upstream called directly, side by side "
                   "(benchmarks/bench_proxy.py docstring)", "question": QUESTION, "bank": BANK, "cells": []}
    with tempfile.TemporaryDirectory() as tmp:
        src = build_sample_collection(Path(tmp) / "sample")
        with FakeUpstream(record=False) as up:
            coll = harness.tests_module("serve_util").copy_collection(src, Path(tmp) / "fake")
            with _server(coll, up.url, args.threads) as srv:
                for conc in args.conc:
                    cell = measure(up.url + "/chat/completions", srv.url + "/v1/chat/completions", _body("fake", None),
                                   conc, args.requests, args.rounds, args.timeout)
                    cell["upstream"] = "fake"
                    rec["cells"].append(cell)
                    print(f"fake conc {conc}: added p50 {cell['added_p50_ms']['median']:.1f} ms, "
                          f"p99 {cell['added_p99_ms']['median']:.1f} ms", flush=True)
                rec["fake_metrics"] = _metric_lines(srv.url)
        if args.bare_conc:  # the fake without /tokenize: the proxy's cost less the count's call
            with FakeUpstream(record=False, tokenize=False) as up:
                coll = harness.tests_module("serve_util").copy_collection(src, Path(tmp) / "bare")
                with _server(coll, up.url, args.threads) as srv:
                    for conc in args.bare_conc:
                        cell = measure(up.url + "/chat/completions", srv.url + "/v1/chat/completions",
                                       _body("fake", None), conc, args.requests, args.rounds, args.timeout)
                        cell["upstream"] = "fake, no /tokenize"
                        rec["cells"].append(cell)
                        print(f"fake without /tokenize conc {conc}: added p50 {cell['added_p50_ms']['median']:.1f} ms, "
                              f"p99 {cell['added_p99_ms']['median']:.1f} ms", flush=True)
        if args.real:
            coll = harness.tests_module("serve_util").copy_collection(src, Path(tmp) / "real")
            with _server(coll, args.real, args.threads) as srv:
                for conc in args.real_conc:
                    cell = measure(args.real.rstrip("/") + "/chat/completions", srv.url + "/v1/chat/completions",
                                   _body("real", args.max_tokens), conc, args.real_requests, args.rounds, args.timeout)
                    cell["upstream"] = "llama.cpp"
                    rec["cells"].append(cell)
                    print(f"llama.cpp conc {conc}: added p50 {cell['added_p50_ms']['median']:.1f} ms, "
                          f"p99 {cell['added_p99_ms']['median']:.1f} ms", flush=True)
                rec["real_metrics"] = _metric_lines(srv.url)
                rec["real_url"] = args.real
    rec["settings"] = {k: v for k, v in vars(args).items() if k != "out_dir"}
    rec["wall_s"] = round(time.perf_counter() - t_start, 1)
    return rec


def figure(rec: dict):
    fig, axes = harness.figure(1, 2, figsize=(10, 4))
    cells = rec["cells"]
    labels = [f"{c['upstream']}\nconc {c['conc']}" for c in cells]
    for ax, q in zip(axes, ("p50", "p99")):
        xs = range(len(cells))
        d = [c[f"direct_{q}_ms"]["median"] if c[f"direct_{q}_ms"] else 0 for c in cells]
        p = [c[f"proxy_{q}_ms"]["median"] if c[f"proxy_{q}_ms"] else 0 for c in cells]
        ax.bar([x - 0.2 for x in xs], d, 0.4, label="upstream directly")
        ax.bar([x + 0.2 for x in xs], p, 0.4, label="through the proxy")
        ax.set_xticks(list(xs), labels)
        ax.set_yscale("log")
        ax.set_ylabel(f"{q} latency, ms (median over rounds)")
        ax.set_title(f"{q}: proxy vs direct")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conc", type=_ints, default=[1, 16, 64], help="fake upstream: concurrent clients (1,16,64)")
    p.add_argument("--requests", type=int, default=128, help="fake upstream: requests per side, cell and round")
    p.add_argument("--rounds", type=int, default=5, help="rounds per cell (default: 5)")
    p.add_argument("--bare-conc", type=_ints, default=[1],
                   help="the fake without /tokenize (the workspace counted by the selection): clients (default: 1)")
    p.add_argument("--real", help="the real upstream's OpenAI base URL (scripts/real_llm.sh status prints it)")
    p.add_argument("--real-conc", type=_ints, default=[1], help="real upstream: concurrent clients (default: 1)")
    p.add_argument("--real-requests", type=int, default=12, help="real upstream: requests per side, cell and round")
    p.add_argument("--max-tokens", type=int, default=16, help="real upstream: the answer's max_tokens (default: 16)")
    p.add_argument("--threads", type=int, default=1, help="the server's torch / engine threads (default: 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="a request's client timeout (a hang guard)")
    p.add_argument("--out-dir", help="where proxy.json / proxy.png go (default: benchmarks/results)")
    args = p.parse_args()
    rec = run(args)
    path = harness.save("proxy", rec, figure(rec), args.out_dir)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
