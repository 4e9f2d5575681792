"""``trawmem info``: bank, thread, unit and edge counts of a collection or of one bank."""
from __future__ import annotations

import json
from pathlib import Path

from .args import Parser
from ..errors import TrawmemError, plural


def cmd_info(a) -> int:
    import numpy as np

    from ..store import Collection, load_bank

    p = Path(a.dir)
    banks, quarantined = ([load_bank(p)], {}) if (p / "meta.json").exists() else _loaded(Collection(p))
    if not banks and not quarantined:
        raise TrawmemError(f"{p}: the collection holds no banks")
    lens = np.concatenate([np.diff(b.thread_offsets) for b in banks] or [np.zeros(1, np.int64)])
    info = {
        "path": str(p), "banks": len(banks), "threads": int(sum(b.n_threads for b in banks)),
        "units": int(sum(b.n_units for b in banks)), "encoder": banks[0].encoder_id if banks else None,
        "quarantined": [{"bank_id": b, "cause": c} for b, c in quarantined.items()],
        "thread_length": {"mean": round(float(lens.mean()), 2), "median": float(np.median(lens)),
                          "min": int(lens.min()), "max": int(lens.max()), "p90": float(np.percentile(lens, 90))},
        "edges": {"adjacent": int(sum((b.edge_kind == 0).sum() for b in banks) // 2),
                  "semantic": int(sum((b.edge_kind == 1).sum() for b in banks) // 2)},
        "per_bank": [{"bank_id": b.bank_id, "units": b.n_units, "threads": b.n_threads} for b in banks],
        "layers": {"facts": sum(len(b.facts) for b in banks), "profile_sections": sum(len(b.profiles) for b in banks)},
        "llm_fallbacks": _fallbacks(banks),
    }
    if a.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{info['path']}: {plural(info['banks'], 'bank')}, {plural(info['threads'], 'thread')}, "
          f"{plural(info['units'], 'unit')} (encoder {info['encoder']})")
    tl = info["thread_length"]
    print(f"thread length: mean {tl['mean']}, median {tl['median']}, min {tl['min']}, p90 {tl['p90']}, "
          f"max {tl['max']}")
    print(f"edges: {info['edges']['adjacent']} adjacent, {info['edges']['semantic']} semantic")
    if any(info["layers"].values()):
        print(f"layers: {plural(info['layers']['facts'], 'fact')}, "
              f"{plural(info['layers']['profile_sections'], 'profile section')}")
    for r in info["per_bank"]:
        print(f"  {r['bank_id']}: {plural(r['units'], 'unit')}, {plural(r['threads'], 'thread')}")
    fb = info["llm_fallbacks"]
    if fb["total"]:
        print(f"LLM fallbacks: {fb['total']} (" + ", ".join(f"{step} {n}" for step, n in fb["by_step"].items())
              + "): outputs that were malformed, refused or failed, replaced by the LLM-free path")
        for bank_id, steps in fb["per_bank"].items():
            for step, whys in steps.items():
                for why, n in sorted(whys.items(), key=lambda kv: -kv[1]):
                    print(f"  {bank_id}: {step}: {n} x {why}")
    if quarantined:
        print(f"quarantined: {plural(len(quarantined), 'bank')} not served (remove one with `trawmem forget "
              f"--collection {p} --bank ID`, then rebuild it):")
        for b, c in quarantined.items():
            print(f"  {b}: {c}")
    return 0


def _fallbacks(banks) -> dict:
    """What fell back from LLM output to the LLM-free path, as the banks recorded it (``stats``
    ``llm_fallbacks``: step -> reason -> count): the total, per step, and per bank."""
    per_bank = {b.bank_id: (b.stats or {}).get("llm_fallbacks") for b in banks}
    per_bank = {k: v for k, v in per_bank.items() if v}
    by_step: dict[str, int] = {}
    for steps in per_bank.values():
        for step, whys in steps.items():
            by_step[step] = by_step.get(step, 0) + sum(int(n) for n in whys.values())
    return {"total": sum(by_step.values()), "by_step": by_step, "per_bank": per_bank}


def _loaded(coll) -> tuple[list, dict]:
    """The banks of ``coll`` that load, and bank id -> cause for those that do not (quarantined)."""
    from ..memory.quarantine import cause_of

    banks, bad = [], {}
    for b in coll.bank_ids:
        try:
            banks.append(coll.load(b))
        except Exception as e:  # noqa: BLE001 - one bad bank fails alone
            bad[b] = cause_of(e, coll.path)
    return banks, bad


def configure(i: Parser) -> None:
    i.describe("Print the bank, thread, unit and edge counts of a collection (or of one bank directory), "
               "the thread-length distribution, and what fell back from LLM output (and why).")
    i.add_argument("dir", help="collection or bank directory")
    i.add_argument("--json", action="store_true", help="print the counts as JSON")
    i.set_defaults(fn=cmd_info)
