"""``trawmem export``: write banks of a collection as JSON Lines (``Memory.export``, docs/export.md)."""
from __future__ import annotations

import json
import sys


def cmd_export(a) -> int:
    from ..memory import Memory

    mem = Memory(a.collection, create=False)
    res = mem.export(a.out, a.bank, progress=sys.stderr.isatty(), vectors=a.vectors)
    print(json.dumps(res))
    return 0


def configure(f) -> None:
    f.describe("Write the banks of a collection (or those named by --bank) as one JSON Lines file: a header, "
               "then per bank its turns, facts and history (docs/export.md), line by line to a temporary file renamed "
               "over --out at the end. Forgotten turns are never written.")
    f.add_argument("--collection", required=True, help="collection directory")
    f.add_argument("--out", required=True, help="the JSON Lines file to write")
    f.add_argument("--bank", nargs="+", metavar="ID", help="bank ids to export (default: all)")
    f.add_argument("--vectors", action="store_true",
                   help="write each turn's, fact's and thread head's vector (base64 float32) with the encoder named in "
                        "the header: an import into a collection of the same encoder encodes nothing")
    f.set_defaults(fn=cmd_export)
