"""An import's write of one bank: its turns, facts and profile sections in one commit
(``memory.export``).

The facts and profiles are a layer step of the append (``BankRegistry.append``'s ``layers``):
added to the bank the append computed, before its one write through ``Collection.update``, so a
kill leaves the bank as it was or with all of them (never turns without their facts).
"""
from __future__ import annotations


class ImportFacts:
    """The layer step of an import's append (``BankRegistry.append``'s ``layers``): the file's
    facts added to the bank the append computed, before its one write (a kill leaves the bank with
    both or neither); facts whose id the bank holds are left (a retried import)."""

    on_create = True

    def __init__(self, records: list[dict], encoder, profiles=()):
        self.records, self.encoder, self.profiles, self.done = records, encoder, list(profiles), {}

    def __call__(self, old, bank, turns):
        from .facts import extend_facts

        have = {f.fact_id for f in bank.facts}
        todo = [r for r in self.records if r.get("id") not in have]
        bank = extend_facts(bank, todo, self.encoder, self.done) if todo else bank
        return with_sections(bank, self.profiles, self.encoder, self.done)


def with_sections(bank, sections, encoder, done: dict):
    """``bank`` with the profile ``sections`` (``store.facts.ProfileSection``) it lacks (by person
    and section: a retried import adds none), each encoded as the profiles layer encodes it;
    ``done["profiles"]`` gets their unit ids. A section citing a fact the bank lacks is left."""
    from dataclasses import replace

    import numpy as np

    from ..store.layers.profiles import profile_embed_text

    have = {(p.person, p.section) for p in bank.profiles}
    facts = {f.fact_id for f in bank.facts}
    todo = [s for s in sections if (s.person, s.section) not in have and set(s.fact_ids) <= facts]
    done["profiles"] = [s.unit_id for s in todo]
    if not todo:
        return bank
    vecs = np.asarray(encoder.encode([profile_embed_text(s) for s in todo]), dtype=np.float32)
    if bank.profiles and bank.profile_vecs is not None:
        vecs = np.concatenate([np.asarray(bank.profile_vecs, dtype=np.float32), vecs])
    out = replace(bank, profiles=tuple(bank.profiles) + tuple(todo), profile_vecs=vecs,
                  layer_sources={**bank.layer_sources, "profiles": bank.layer_sources.get("profiles", "import")})
    out.validate()
    return out


def add_imported(mem, bank_id: str, batch, facts: list[dict], encoder, llm=None, profiles=()) -> tuple[dict, list, list]:
    """Append ``batch`` (``memory.messages.request_batch``), ``facts`` and the profile sections
    ``profiles`` to bank ``bank_id`` of ``mem`` (a ``Memory`` or ``serve.portable.ServedMemory``)
    in one write, with ``encoder``; ``(the append's answer, the ids of the facts added, the unit
    ids of the sections added)``. Facts of a bank that holds every turn already (nothing to
    append) are added in a write of their own (:func:`_own_write`)."""
    from .answers import append_answer
    from .facts import fact_events

    step = ImportFacts(facts, encoder, profiles)
    with mem._core.publishing(bank_id):
        res = mem._core.append(bank_id, batch, encoder, llm, layers=step if (facts or profiles) else None)
        if res.bank is not None:
            mem._publish(bank_id, res.bank)
    added = list(step.done.get("added", ()))
    if step.done.get("pairs"):
        mem._core.registry._record(bank_id, fact_events([], step.done["pairs"]))
    if (facts or profiles) and not step.done and res.bank is not None:
        added = _own_write(mem, bank_id, step)
    return append_answer(bank_id, res, batch.scope), added, list(step.done.get("profiles", ()))


def _own_write(mem, bank_id: str, step: ImportFacts) -> list:
    """The facts and sections of ``step`` added in a write of their own (the append had nothing to
    store, so its layer step did not run): one ``BankRegistry.rewrite``, published, its events
    kept; the ids of the facts added."""
    from .facts import fact_events
    from .history import write_events

    bank = mem._core.registry.rewrite(bank_id, lambda old: step(old, old, ()), lambda old, new: fact_events(
        write_events(old, new, "import", sessions=set()), step.done.get("pairs", ())))
    mem._publish(bank_id, bank)
    return list(step.done.get("added", ()))
