"""``trawmem repair-index``: rebuild a collection's index from its banks' metadata."""
from __future__ import annotations

from pathlib import Path

from .args import Parser
from ..errors import plural


def cmd_repair_index(a) -> int:
    from ..store import repair_index

    r = repair_index(a.dir)
    extra = "".join(f"; {k} {len(r[k])}: {', '.join(map(repr, r[k][:5]))}{' ...' if len(r[k]) > 5 else ''}"
                    for k in ("added", "dropped") if r[k])
    print(f"rebuilt {Path(a.dir) / 'collection.json'} from the banks' metadata: {plural(r['banks'], 'bank')}{extra}")
    return 0


def configure(r: Parser) -> None:
    r.describe("Rebuild DIR/collection.json from the metadata of the bank directories under DIR/banks, under "
               "the collection lock (for a collection that lost its index).")
    r.add_argument("dir", help="collection directory")
    r.set_defaults(fn=cmd_repair_index)
