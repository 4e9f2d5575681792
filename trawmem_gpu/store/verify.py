"""The one check of reused banks against the data they are meant to hold.

Every command that takes a data file and reuses stored banks calls :func:`verify_banks` before
it selects anything: ``eval --banks`` (and its automatic cache), ``score --data`` (its automatic
collection or ``--banks``), ``sweep --banks``, ``train-head`` / ``train-affinity`` (through
``eval.retrieval.banks_for``). A bank is the data's when it was built from exactly the data's
turns (the turns digest, ``trawmem_gpu.data.turns_digest``, which every bank records and which
``load_bank`` checks against its own units) and, when the caller names one, with the same build
config. Anything else is a ``BankError`` naming the bank and the difference: stale banks are
never used silently.

``serve`` (and ``score --banks DIR --questions FILE``) take no data file: the collection *is*
the source. What applies there is the store's own check, on every load: checksums, the turns
digest against the bank's units and the bank id against the index (``store.files.load_bank``).
A resumed ``score`` also compares each written record's bank digest (:func:`bank_digest`) with
the bank it would use now.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..data.types import turns_digest
from ..errors import BankError, name_list


def bank_digest(bank_or_meta) -> str:
    """What a workspace depends on in a bank: its turns digest, build config and encoder, from a
    loaded ``Bank`` or its checked ``meta.json`` (``read_meta``, no tensors read) of a bank without
    segments, which give the same digest (:func:`stored_digest` takes either). 16 hex digits;
    equal for a rebuild of the same turns with the same config."""
    if isinstance(bank_or_meta, dict):
        m = bank_or_meta
        if m.get("segments"):
            raise ValueError("bank_digest of a meta.json with segments: its turns_sha256 is the base's (use stored_digest)")
        body = [m.get("turns_sha256"), m.get("build_config") or {}, m.get("encoder_id")]
    else:
        b = bank_or_meta
        body = [turns_digest(b.turns), b.build_config or {}, b.encoder_id]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def stored_digest(path) -> str:
    """:func:`bank_digest` of the bank stored at ``path``: from its ``meta.json`` alone when it has
    no segments (its turns digest is then the whole bank's), else from its turns."""
    from .files import load_bank, read_meta

    meta = read_meta(path)
    return bank_digest(load_bank(path) if meta.get("segments") else meta)


def stored_turns_digest(coll, bank_id: str, meta: dict) -> str:
    """The digest of all the turns the stored bank holds (its base's and its segments')."""
    return turns_digest(coll.load(bank_id).turns) if meta.get("segments") else meta.get("turns_sha256")


def verify_banks(coll, convs, data_path: str | Path, build_config: dict | None = None, *,
                 exact: bool = True) -> list[str]:
    """Check the banks of ``coll`` for the conversations ``convs`` (read from ``data_path``).

    :param build_config: the build config the banks must have been built with (a
        ``BuildConfig.to_dict()``), or None to accept the banks' own
    :param exact: the collection must hold exactly the data's banks (``eval``); False: banks the
        data does not name are ignored and missing ones are returned, for the caller to build or
        refuse
    :returns: the ids of ``convs`` the collection does not hold (empty with ``exact``)
    :raises BankError: a bank built from other turns or with another build config (naming the
        bank, the counts and the first differing turn), a missing or extra bank with ``exact``,
        or a corrupt bank
    """
    from .files import read_meta

    want = [c.bank_id for c in convs]
    missing = [b for b in want if b not in coll]
    if exact:
        have = set(want)
        extra = [b for b in coll.bank_ids if b not in have]
        if missing or extra:
            parts = ([f"lacks {len(missing)} bank(s) of the data ({name_list(missing)})"] if missing else []) + \
                    ([f"holds {len(extra)} bank(s) the data does not ({name_list(extra)})"] if extra else [])
            raise BankError(f"{coll.path} {' and '.join(parts)}: it was built from other data")
    for c in convs:
        if c.bank_id not in coll:
            continue
        meta = read_meta(coll.bank_path(c.bank_id))
        if stored_turns_digest(coll, c.bank_id, meta) != turns_digest(c.turns):
            ours = {t.turn_id: t for t in coll.load(c.bank_id).turns}
            first = next((t.turn_id for t in c.turns if ours.get(t.turn_id) != t), None)
            detail = f"first differing turn {first!r}" if first else "same turns in another order"
            raise BankError(f"bank {c.bank_id!r} in {coll.path} was built from other turns than {c.bank_id!r} in "
                            f"{data_path} (bank: {meta.get('n_units')} turns, data: {len(c.turns)}; {detail})")
        stored = meta.get("build_config") or {}
        if build_config is not None and stored != build_config:
            diff = sorted(k for k in set(build_config) | set(stored) if stored.get(k) != build_config.get(k))
            raise BankError(f"bank {c.bank_id!r} in {coll.path} was built with another build config (it differs "
                            f"in {', '.join(diff) or 'its fields'})")
    return missing
