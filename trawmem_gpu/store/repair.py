"""``trawmem repair-index``: a collection's index rebuilt from its banks' own metadata."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import BankError
from .collection import BANKS, INDEX, LOCK_TIMEOUT_S, Collection, _bank_dirs, _valid_dirname
from .files import read_meta
from .vectors import DEFAULT_VECTORS


def repair_index(path: str | Path, *, timeout: float = LOCK_TIMEOUT_S) -> dict:
    """Rebuild ``path/collection.json`` from the banks' own metadata (``trawmem repair-index``).

    Under the collection lock: a bank left aside as ``banks/.<name>.old-*`` by a write killed
    between its two renames is first put back; then every bank directory's checked
    ``meta.json`` gives its bank id and encoder, and the index is written atomically. Refused,
    with nothing written, when a directory holds no readable bank, two directories hold one bank
    id, or the banks disagree on the encoder.

    :returns: ``{"banks": n, "added": [ids not in the old index], "dropped": [ids of the old
        index with no directory], "encoder_id": ...}``
    """
    path = Path(path)
    if not (path / BANKS).is_dir():
        raise BankError(f"{path}: no {BANKS}/ directory, so no banks to index")
    coll = Collection.__new__(Collection)
    coll.path, coll.timeout, coll.banks, coll.encoder_id = path, float(timeout), {}, None
    coll._asked, coll.vectors, coll._index_stat = None, DEFAULT_VECTORS, None  # a readable old index's choice is kept
    with coll.lock():
        old: dict = {}
        if (path / INDEX).exists():
            try:
                coll.refresh()
                old = dict(coll.banks)
            except BankError:
                old = {}  # a corrupt index is what is being repaired
        bdir = path / BANKS
        for p in sorted(bdir.glob(".*.old-*")):
            live = bdir / p.name[1:p.name.rindex(".old-")]
            if p.is_dir() and not live.exists():
                os.replace(p, live)
        banks: dict[str, str] = {}
        encoders: dict[str, str] = {}
        for name in _bank_dirs(path):
            if not _valid_dirname(name):
                raise BankError(f"{bdir / name}: not a bank directory name this store writes; move it out of "
                                f"{bdir} and run `trawmem repair-index {path}` again")
            try:
                meta = read_meta(bdir / name)
            except BankError as e:
                raise BankError(f"cannot repair the index of {path}: {e}; remove or move {bdir / name} and run "
                                f"`trawmem repair-index {path}` again") from None
            bid = meta.get("bank_id")
            if not isinstance(bid, str):
                raise BankError(f"{bdir / name / 'meta.json'}: no bank id in the metadata")
            if bid in banks:
                raise BankError(f"cannot repair the index of {path}: {bdir / banks[bid]} and {bdir / name} both "
                                f"hold bank {bid!r}; remove one")
            banks[bid] = name
            encoders[bid] = meta.get("encoder_id")
        if len(set(encoders.values())) > 1:
            raise BankError(f"cannot repair the index of {path}: its banks were encoded with "
                            f"{sorted(map(str, set(encoders.values())))}; one collection holds one embedding space")
        coll.banks = banks
        coll.encoder_id = next(iter(encoders.values()), None)
        coll._write_index()
    return {"banks": len(banks), "added": [b for b in banks if b not in old],
            "dropped": [b for b in old if b not in banks], "encoder_id": coll.encoder_id}
