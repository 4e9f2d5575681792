"""``trawmem forget``: forget turns of a bank, or a whole bank, everywhere (``Memory.forget``)."""
from __future__ import annotations

import json
import sys

from ..errors import plural


def cmd_forget(a) -> int:
    from ..llm.factory import llm_from_args, llm_options
    from ..memory import Memory

    mem = Memory(a.collection, create=False)  # opening it finishes any forget a kill left unfinished
    for r in mem._core.finished:
        if r["bank_id"] != a.bank:
            print(f"finished an interrupted forget of {r['bank_id']!r} ({plural(len(r['forgotten']), 'turn')}"
                  f"{', the bank is gone' if r['deleted'] else ''})", file=sys.stderr)
    llm = llm_from_args(a.llm, check=True, **llm_options(a)) if a.llm else None
    try:
        res = mem.forget(a.bank, a.turns, outputs=a.outputs or (), llm=llm)
    finally:
        if llm is not None:
            llm.close()
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    what = "the whole bank" if a.turns is None else plural(len(res["forgotten"]), "turn")
    left = "the bank is gone" if res["deleted"] else f"{plural(res['n_units'], 'unit')} left"
    print(f"forgot {what} of {a.bank!r} ({left}); erased {plural(res['cache_rows'], 'cache row')}"
          + (f", {plural(res['output_records'], 'score record')}" if a.outputs else ""))
    if res["missing"]:
        shown = ", ".join(map(repr, res["missing"][:10])) + (" ..." if len(res["missing"]) > 10 else "")
        print(f"not in the bank (forgotten before, or never there): {shown}")
    return 0


def configure(f) -> None:
    from .args import add_llm_options
    from ..llm.spec import SPEC_HELP

    f.describe("Forget turns of a bank (--turns), or the whole bank, everywhere: the bank is rebuilt without "
               "them and written atomically, and the embedding and LLM caches under TRAWMEM_CACHE and the "
               "score outputs named by --outputs are scrubbed of them (docs/python-api.md, Forgetting). "
               "A forget that was interrupted is finished by the next open of the collection (this command, "
               "`trawmem serve`, Memory), with the outputs it named. A quarantined bank (`trawmem info` lists "
               "them) can be forgotten whole, without --turns.")
    f.add_argument("--collection", required=True, help="collection directory")
    f.add_argument("--bank", required=True, help="bank id")
    f.add_argument("--turns", nargs="+", metavar="ID",
                   help="turn ids to forget (default: the whole bank)")
    f.add_argument("--outputs", nargs="+", metavar="FILE",
                   help="`trawmem score` outputs to take the bank's records with forgotten turns out of (default: "
                        "none besides the bank and the caches)")
    f.add_argument("--llm", help=f"LLM for a bank built with llm segmentation or heads: {SPEC_HELP} (default: "
                                 "none: the touched sessions fall back to embedding segmentation and extractive heads)")
    add_llm_options(f)
    f.add_argument("--json", action="store_true", help="print the result as JSON")
    f.set_defaults(fn=cmd_forget)
