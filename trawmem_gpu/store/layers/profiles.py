"""The profiles layer: one section (``store.facts.ProfileSection``) per person and section, each
line citing the facts behind it (so it requires the facts layer).

In a unit view each person's sections are one thread after every turn thread (sections in
``store.facts.SECTIONS`` order, persons sorted); a section cites its facts' units, or, without
the facts layer among the units, their source turns'. A forget drops the sections citing a fact
that went (the next profile build re-derives them).
"""
from __future__ import annotations

from collections import Counter

from ..facts import SECTIONS, ProfileSection, profile_from_record
from .base import Layer, LayerUnit, ViewThread, register

PROFILE_SPEAKER = "profile"


def profile_embed_text(p: ProfileSection) -> str:
    """What the encoder sees of a profile section."""
    return f"{p.person}, {p.section.replace('_', ' ')}: {p.text()}"


def _view(profiles, ctx) -> list[ViewThread]:
    """One thread per person (persons sorted, sections in ``SECTIONS`` order)."""
    by_person: dict[str, list[int]] = {}
    for i in sorted(range(len(profiles)), key=lambda i: (profiles[i].person, SECTIONS.index(profiles[i].section))):
        by_person.setdefault(profiles[i].person, []).append(i)
    out = []
    for person, rows in by_person.items():
        units = tuple(LayerUnit(profiles[i].unit_id, PROFILE_SPEAKER, profile_embed_text(profiles[i]), -1, "profile",
                                None, None, layer="profiles", cites=profiles[i].fact_ids,
                                cited_turns=ctx.turns_behind(profiles[i].fact_ids)) for i in rows)
        out.append(ViewThread(units, tuple(rows), f"profile of {person}", None))
    return out


def _check(bank, profiles, ids) -> None:
    """One section per person and section."""
    keys = [(p.person, p.section) for p in profiles]
    if len(set(keys)) != len(keys):
        dup = next(k for k, c in Counter(keys).items() if c > 1)
        raise ValueError(f"bank {bank.bank_id!r}: two profile sections {dup[1]!r} for {dup[0]!r}")


PROFILES = register(Layer(
    name="profiles", record=ProfileSection, position=20, noun="profile", unit_id=lambda p: p.unit_id,
    cites=lambda p: p.fact_ids, to_record=ProfileSection.to_record, from_record=profile_from_record, view=_view,
    tensor="profile_vecs", text=ProfileSection.text, requires=("facts",), field="profiles", vecs_field="profile_vecs", always=True,
    check=_check))
