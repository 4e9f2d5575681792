"""``trawmem import``: import a JSON Lines export into a collection (``Memory.import_``, docs/export.md)."""
from __future__ import annotations

import json
import sys


def cmd_import(a) -> int:
    from ..memory import Memory

    mem = Memory(a.collection)
    res = mem.import_(a.input, progress=sys.stderr.isatty(), format=a.format)
    print(json.dumps(res))
    return 0


def configure(f) -> None:
    f.describe("Import a `trawmem export` file into a collection, bank by bank; turns the collection has "
               "forgotten are refused (listed per bank). A bad line stops the import with its line number and "
               "field; the bank it was in is not written (docs/export.md).")
    f.add_argument("--collection", required=True, help="collection directory (created if missing)")
    f.add_argument("--input", required=True, help="the JSON Lines file to read")
    from ..data.importers import IMPORTERS

    f.add_argument("--format", default="trawmem", choices=["trawmem", *IMPORTERS],
                   help="the input's format (default: a trawmem export; the others' mappings: docs/export.md)")
    f.set_defaults(fn=cmd_import)
