"""What the typed backend (``serve/backend.py``, issue 43 item 2) adds to a request: the route's
hop into its backend, before and after, side by side in one run.

Before (commit 6ebe3e7) a route called the ``SelectionService`` itself (``await service.select``,
``await maybe_await(service.bank_list())``) and each ``RemoteBackend`` method was written out
(``return await self._call("select", items, batch, quota)``); after, the route awaits a
``LocalBackend`` method that calls the service, and the ``RemoteBackend`` methods are made from
the table ``backend.CALLS`` (the Protocol's signature binds the arguments). The "before" hops are
restated below, as they were; the service and the socket are stand-ins that answer at once, so
only the hop is timed. Rounds alternate before / after; the figures are the medians and the
minimums over rounds of the mean nanoseconds per call (on a loaded machine the minimum is the
steadier estimate of a hop's own cost). Saves ``backend_overhead.json`` (under the archive).

    python -m benchmarks.experiments.backend_overhead [--calls 20000] [--rounds 7] [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import time

from .. import harness


class _Service:
    """A SelectionService stand-in: its select a coroutine, its reads plain methods (as the real one)."""

    ready, dim, encoder_id, defaults = True, 384, "stub", None

    async def select(self, items, batch=False, quota=None):
        return items

    def bank_list(self):
        return []


async def _maybe_await(x):  # serve/replies.py before the change
    return await x if inspect.isawaitable(x) else x


class _OldRemote:
    """``RemoteBackend``'s methods before the change, over a socket that answers at once."""

    async def _call(self, op, *args):
        return args

    async def select(self, items, batch=False, quota=None):
        return await self._call("select", items, batch, quota)

    async def bank_list(self):
        return await self._call("bank_list")


async def _stub_call(op, *args):
    return args


def _paths():
    from trawmem_gpu.serve.backend import LocalBackend
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.remote import RemoteBackend

    svc, old_remote = _Service(), _OldRemote()
    local = LocalBackend(svc)
    remote = RemoteBackend("/nonexistent.sock", ServeConfig())
    remote._call = _stub_call  # the socket: answers at once
    items = [object()]
    return {
        "local select": (lambda: svc.select(items, batch=False, quota=None),
                         lambda: local.select(items, batch=False, quota=None)),
        "local bank_list": (lambda: _maybe_await(svc.bank_list()), lambda: local.bank_list()),
        "remote select": (lambda: old_remote.select(items, quota=None), lambda: remote.select(items, quota=None)),
        "remote bank_list": (lambda: old_remote.bank_list(), lambda: remote.bank_list()),
    }


async def _ns_per_call(make, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        await make()
    return (time.perf_counter_ns() - t0) / calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out-dir")
    args = p.parse_args(argv)
    paths = _paths()

    async def run() -> dict:
        out = {name: {"before": [], "after": []} for name in paths}
        for r in range(args.rounds):
            for name, (before, after) in paths.items():
                pair = (("before", before), ("after", after))
                for side, make in (pair if r % 2 == 0 else pair[::-1]):
                    out[name][side].append(await _ns_per_call(make, args.calls))
        return out

    raw = asyncio.run(run())
    rows = {}
    for name, sides in raw.items():
        b, a = statistics.median(sides["before"]), statistics.median(sides["after"])
        bmin, amin = min(sides["before"]), min(sides["after"])
        rows[name] = {"before_ns": round(b, 1), "after_ns": round(a, 1), "added_ns": round(a - b, 1),
                      "before_min_ns": round(bmin, 1), "after_min_ns": round(amin, 1),
                      "added_min_ns": round(amin - bmin, 1),
                      "rounds_before_ns": [round(x, 1) for x in sides["before"]],
                      "rounds_after_ns": [round(x, 1) for x in sides["after"]]}
        print(f"{name:18s} median: before {b:6.0f} after {a:6.0f} added {a - b:+6.0f} ns; "
              f"minimum: before {bmin:6.0f} after {amin:6.0f} added {amin - bmin:+6.0f} ns per call")
    path = harness.save("backend_overhead", {"calls_per_round": args.calls, "rounds": args.rounds, "paths": rows},
                        out_dir=args.out_dir or harness.results_dir(default=harness.ARCHIVE))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
