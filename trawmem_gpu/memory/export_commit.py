"""An import's write of one bank: its turns and its facts in one commit (``memory.export``).

The facts are a layer step of the append (``BankRegistry.append``'s ``layers``): added to the bank
the append computed, before its one write through ``Collection.update``, so a kill leaves the bank
as it was or with both (never turns without their facts).
"""
from __future__ import annotations


class ImportFacts:
    """The layer step of an import's append (``BankRegistry.append``'s ``layers``): the file's
    facts added to the bank the append computed, before its one write (a kill leaves the bank with
    both or neither); facts whose id the bank holds are left (a retried import)."""

    on_create = True

    def __init__(self, records: list[dict], encoder):
        self.records, self.encoder, self.done = records, encoder, {}

    def __call__(self, old, bank, turns):
        from .facts import extend_facts

        have = {f.fact_id for f in bank.facts}
        todo = [r for r in self.records if r.get("id") not in have]
        return extend_facts(bank, todo, self.encoder, self.done) if todo else bank


def add_imported(mem, bank_id: str, batch, facts: list[dict], encoder, llm=None) -> tuple[dict, list]:
    """Append ``batch`` (``memory.messages.request_batch``) and ``facts`` to bank ``bank_id`` of
    ``mem`` (a ``Memory`` or ``serve.portable.ServedMemory``) in one write, with ``encoder``;
    ``(the append's answer, the ids of the facts added)``. Facts of a bank that holds every turn
    already (nothing to append) are added in a write of their own."""
    from .answers import append_answer
    from .facts import fact_events

    step = ImportFacts(facts, encoder)
    with mem._core.publishing(bank_id):
        res = mem._core.append(bank_id, batch, encoder, llm, layers=step if facts else None)
        if res.bank is not None:
            mem._publish(bank_id, res.bank)
    added = list(step.done.get("added", ()))
    if step.done.get("pairs"):
        mem._core.registry._record(bank_id, fact_events([], step.done["pairs"]))
    if facts and not step.done and res.bank is not None:
        have = {f.fact_id for f in res.bank.facts}
        todo = [f for f in facts if f.get("id") not in have]
        if todo:
            added = mem.add_facts(bank_id, todo)["added"]
    return append_answer(bank_id, res, batch.scope), added
