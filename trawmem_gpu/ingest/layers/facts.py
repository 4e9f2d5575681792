"""``build --facts {none,locomo,llm}``: the facts layer of freshly built or updated banks.

:func:`attach_facts` gives each bank its facts, encoded with the bank's encoder (the text of
:func:`~trawmem_gpu.store.view.fact_embed_text`), and returns the banks with the layer beside
their turns (``Bank.facts``, ``fact_vecs``, ``layer_sources["facts"]``):

* ``none``: the banks as they are (an updated bank keeps the facts it had);
* ``locomo``: LoCoMo's per-session observations of the input file (``ingest.layers.locomo``);
* ``llm``: :func:`~trawmem_gpu.ingest.layers.extract.extract_facts` over the turns, in windows.

With ``new_turns`` (an ``--update``: bank id -> the turns it appended), only facts of the new
turns are added: ``locomo`` adds the observations that cite a new turn (an id a stored fact has is
numbered on), after :func:`check_locomo_update` found the observations of the stored turns
unchanged (else the update is refused as a conflict, new turns or not);
``llm`` extracts over the new turns, with up to ``overlap`` turns before them as context, and keeps
the facts that cite a new turn. New ``llm`` facts are numbered on from the bank's own
(``F:<session>:<n>``), so ids stay bank-unique. New facts supersede stored ones
(``ingest.layers.supersede``): keyed facts by rule, and on an ``llm`` update as the LLM proposes.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...data.types import Turn
from ...errors import ConfigError
from ...store.bank import Bank
from ...store.facts import Fact, fact_id
from ...store.view import fact_session

FACT_SOURCES: tuple[str, ...] = ("none", "locomo", "llm")


def _renumber(bank: Bank, facts: list[Fact], turn_by_id: dict[str, Turn], *, keep_free: bool = False) -> list[Fact]:
    """``facts`` with bank-unique ids ``F:<session>:<n>``, numbered on past the bank's own
    (``keep_free``: a fact whose id no other fact has keeps it)."""
    taken = {f.fact_id for f in bank.facts}
    if keep_free:
        free = [f for f in facts if f.fact_id not in taken]
        taken |= {f.fact_id for f in free}
        free_ids = {id(f) for f in free}
    nxt: dict[int, int] = {}
    out = []
    for f in facts:
        if keep_free and id(f) in free_ids:
            out.append(f)
            continue
        s = fact_session(f, turn_by_id)
        n = nxt.get(s, 0) + 1
        while fact_id(s, n) in taken:
            n += 1
        nxt[s] = n
        taken.add(fact_id(s, n))
        out.append(replace(f, fact_id=fact_id(s, n), session=str(s)))
    return out


def _encode(facts: list[Fact], bank: Bank, encoder, batch_size: int = 64) -> np.ndarray:
    from ...store.view import fact_embed_text

    tb = {t.turn_id: t for t in bank.turns}
    return encoder.encode([fact_embed_text(f, tb[f.source_turns[0]].timestamp) for f in facts], batch_size=batch_size)


def with_facts(bank: Bank, new: list[Fact], encoder, source: str, vecs: np.ndarray | None = None) -> Bank:
    """``bank`` with ``new`` facts appended to its layer (encoded here, unless their ``vecs`` are
    given), recorded as from ``source``."""
    if not new:
        return bank if bank.facts or source == "none" else replace(bank, layer_sources={**bank.layer_sources,
                                                                                         "facts": source})
    if encoder.id != bank.encoder_id:
        raise ConfigError(f"`facts`: bank {bank.bank_id!r} was encoded with {bank.encoder_id!r}, not {encoder.id!r}")
    v = _encode(new, bank, encoder) if vecs is None else vecs
    vecs = v if bank.fact_vecs is None else np.concatenate([bank.fact_vecs, v])
    out = replace(bank, facts=tuple(bank.facts) + tuple(new), fact_vecs=vecs.astype(np.float32),
                  layer_sources={**bank.layer_sources, "facts": source})
    out.validate()
    return out


def _fact_whys(st: dict, emb_why: dict) -> dict:
    """A bank's facts fallbacks by reason: failed windows, refused facts (text and embedding checks)."""
    out = dict(st.get("refusals") or {})
    if st.get("failed"):
        out["window failed (malformed, or the request failed)"] = int(st["failed"])
    for k, n in emb_why.items():
        out[k] = out.get(k, 0) + n
    return out


def with_fallbacks(stats: dict, step: str, whys: dict) -> dict:
    """``stats`` with ``whys`` (reason -> n) added under ``llm_fallbacks[step]`` (the bank's record
    of what fell back, which ``trawmem info`` shows)."""
    fb = {k: dict(v) for k, v in (stats or {}).get("llm_fallbacks", {}).items()}
    d = fb.setdefault(step, {})
    for k, n in whys.items():
        d[k] = d.get(k, 0) + int(n)
    return {**(stats or {}), "llm_fallbacks": fb}


def check_locomo_update(bank: Bank, input_path, *, dayfirst: bool = False) -> None:
    """Refuse an ``--update`` of ``bank`` whose facts come from LoCoMo observations when the
    input's observations of the bank's stored turns are not the bank's facts (an old observation
    edited, added or removed; or a bank whose facts were not read from this input): an
    ``InputError`` naming the bank and the first difference. The update would add the new turns'
    facts only, and the bank would no longer equal a full build of the input."""
    from ...errors import InputError
    from .locomo import load_locomo_facts, observation_conflict

    got, _ = load_locomo_facts(input_path, {bank.bank_id: {t.turn_id for t in bank.turns}}, dayfirst=dayfirst)
    why = observation_conflict(bank.facts, got.get(bank.bank_id, []))
    if why is not None:
        source = bank.layer_sources.get("facts", "none")
        how = "" if source == "locomo" else f" (its facts came from `facts` {source!r}, not these observations)"
        raise InputError(f"`update`: bank {bank.bank_id!r}{how}: {why}; the input's observations of the stored "
                         f"turns conflict with the bank's facts: rebuild the bank without `update`")


def supported_facts(bank: Bank, facts: list[Fact], encoder, llm=None) -> tuple[list[Fact], np.ndarray | None, dict]:
    """The LLM ``facts`` of ``bank`` whose vector reaches one of their cited turns' vectors
    (``llm.grounding.FACT_EMBEDDING_FLOOR``), their vectors, and the refused by reason (counted on
    ``llm.usage``; an error under ``--strict-llm``)."""
    from ...llm.grounding import FACT_EMBEDDING_FLOOR, embedding_support
    from ...llm.structured import fell_back

    if not facts:
        return facts, None, {}
    if encoder.id != bank.encoder_id:
        raise ConfigError(f"`facts`: bank {bank.bank_id!r} was encoded with {bank.encoder_id!r}, not {encoder.id!r}")
    v = _encode(facts, bank, encoder)
    row = {t.turn_id: i for i, t in enumerate(bank.turns)}
    keep, why = [], []
    for k, f in enumerate(facts):
        s = embedding_support(v[k], bank.unit_vecs[[row[t] for t in f.source_turns if t in row]])
        if s >= FACT_EMBEDDING_FLOOR:
            keep.append(k)
        else:
            why.append(("refused", f"not supported by its cited turns (embedding support < {FACT_EMBEDDING_FLOOR})"))
    if why and llm is not None:
        llm.usage.note("trimem-fact", refused=len(why))
    whys = fell_back(llm, "trimem-fact", why, "fact") if why else {}
    return [facts[k] for k in keep], v[keep], whys


def attach_facts(banks: list[Bank], source: str, encoder, *, input_path=None, llm=None, dayfirst: bool = False,
                 new_turns: dict[str, list[Turn]] | None = None, window: int | None = None, prompts=None
                 ) -> tuple[list[Bank], dict]:
    """The banks with their facts layer from ``source`` (see the module docstring), and counts."""
    if source not in FACT_SOURCES:
        raise ConfigError(f"`facts` must be one of {', '.join(FACT_SOURCES)} (got {source!r})")
    stats: dict = {"facts_added": 0}
    if source == "none" or not banks:
        return list(banks), stats
    fresh: dict[str, list[Fact]] = {}
    vecs: dict[str, np.ndarray | None] = {}
    why: dict[str, dict] = {}
    if source == "locomo":
        from .locomo import load_locomo_facts

        from ...data import detect_format

        if input_path is None or detect_format(input_path) != "locomo":
            raise ConfigError("`facts` 'locomo' reads the per-session observations of a LoCoMo-layout input "
                              f"({'none given' if input_path is None else f'{input_path} is not one'})")
        got, st = load_locomo_facts(input_path, {b.bank_id: {t.turn_id for t in b.turns} for b in banks},
                                    dayfirst=dayfirst)
        stats.update(st)
        for b in banks:
            if new_turns is None:
                have = {f.fact_id for f in b.facts}
                fresh[b.bank_id] = [f for f in got.get(b.bank_id, []) if f.fact_id not in have]
                continue
            # an update: the facts citing a new turn (no stored fact can); their numbers may be a stored
            # fact's (an observation dropped at the first build, its turn not there yet, numbered the
            # session's later facts one lower), so a taken id is numbered on
            new_ids = {t.turn_id for t in new_turns.get(b.bank_id, [])}
            fresh[b.bank_id] = _renumber(b, [f for f in got.get(b.bank_id, []) if set(f.source_turns) & new_ids],
                                         {t.turn_id: t for t in b.turns}, keep_free=True)
    else:
        from .extract import OVERLAP, WINDOW, extract_facts

        if llm is None:
            raise ConfigError("`facts` 'llm' needs an LLM (`llm`)")
        for b in banks:
            turns = list(b.turns)
            new_ids = None
            if new_turns is not None:
                add = new_turns.get(b.bank_id, [])
                if not add:
                    fresh[b.bank_id] = []
                    continue
                new_ids = {t.turn_id for t in add}
                first = next(i for i, t in enumerate(turns) if t.turn_id in new_ids)
                turns = turns[max(0, first - OVERLAP):]
            facts, st = extract_facts(turns, llm, window=window or WINDOW, overlap=OVERLAP, prompts=prompts,
                                      existing=b.facts if new_ids is not None else ())
            for k, v in st.items():
                if isinstance(v, (int, float)) and k != "window":
                    stats[k] = stats.get(k, 0) + v
            stats["window"] = max(stats.get("window", 0), st.get("window", 0))
            known = {t.turn_id for t in turns}
            facts = [f for f in facts if set(f.source_turns) <= known
                     and (new_ids is None or set(f.source_turns) & new_ids)]
            facts, vecs[b.bank_id], emb_why = supported_facts(b, _renumber(b, facts, {t.turn_id: t for t in b.turns}),
                                                              encoder, llm)
            fresh[b.bank_id] = facts
            why[b.bank_id] = _fact_whys(st, emb_why)
            stats["refused"] = stats.get("refused", 0) + sum(emb_why.values())
    out = []
    for b in banks:
        nb = with_facts(b, fresh.get(b.bank_id, []), encoder, source, vecs.get(b.bank_id))
        if why.get(b.bank_id):
            nb = replace(nb, stats=with_fallbacks(nb.stats, "facts", why[b.bank_id]))
        stats["facts_added"] += len(nb.facts) - len(b.facts)
        out.append(superseded(b, nb, llm if source == "llm" and new_turns is not None else None, stats))
    return out, stats


def superseded(old: Bank, new: Bank, llm, stats: dict) -> Bank:
    """``new`` (``old`` with facts appended) with the supersessions of its new facts applied
    (``ingest.layers.supersede``: by rule for keyed facts; with ``llm``, as it proposes against the
    stored facts); ``stats["superseded"]`` counts them."""
    from .supersede import SupersedeStats, supersede

    added = new.facts[len(old.facts):]
    if not added:
        return new
    st = SupersedeStats()
    res = supersede(old.facts, added, llm, st)
    stats["superseded"] = stats.get("superseded", 0) + st.superseded
    if llm is not None:
        stats["supersede_llm"] = {k: stats.get("supersede_llm", {}).get(k, 0) + v for k, v in st.to_dict().items()}
    return replace(new, facts=res.facts) if res.pairs else new
