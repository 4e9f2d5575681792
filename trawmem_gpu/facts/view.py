"""A bank's unit view for a ``units`` tuple: the layers that selection takes as units.

``unit_view(bank, ("turns",))`` is the bank itself (the engines' tables and picks are today's).
With more layers, the view is a :class:`~trawmem_gpu.store.bank.Bank` whose ``turns`` are the
bank's turns (same indices, same threads) followed by one :class:`LayerUnit` per fact and per
profile section, so every engine, the reference and the workspace take it unchanged:

* **units**: the turns, then the facts (by session, in their order), then the profile sections
  (by person, in :data:`~trawmem_gpu.facts.schema.SECTIONS` order); vectors are the bank's
  (``unit_vecs``, ``fact_vecs``, ``profile_vecs``);
* **threads**: the bank's threads, then one fact thread per session (a thread never crosses a
  session) and one profile thread per person; a layer thread's head vector is the normalized mean
  of its units' vectors;
* **thread graph**: the bank's edges, plus a ``LAYER`` edge (weight 1, both directions) between a
  fact thread and every thread holding one of its facts' source turns, and between a profile
  thread and the threads of the facts (or, without the facts layer, of their source turns) its
  lines cite;
* **support links** (``support_src`` / ``support_dst``): each fact restates its source turns, each
  profile section the facts behind it (their source turns when facts are not units); the support
  kernel K reads them (``select.objective.support_kernel``).

A view is never stored (``store.files`` refuses it) and holds no layers of its own (they are units).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..construct.graph import LAYER
from ..data.types import Turn
from ..errors import ConfigError
from ..store.bank import Bank
from .schema import SECTIONS, Fact, ProfileSection

UNIT_KINDS: tuple[str, ...] = ("turns", "facts", "profiles")
"""The layers a view may take as units, in the order they stand in it."""
DEFAULT_UNITS: tuple[str, ...] = ("turns",)
FACT_SPEAKER, PROFILE_SPEAKER = "fact", "profile"


@dataclass(frozen=True)
class LayerUnit(Turn):
    """A fact or profile section as a unit of a view: a ``Turn`` (what the engines read) that
    knows its layer and the ids it cites (a fact: its source turns; a section: its facts)."""

    layer: str = "facts"
    cites: tuple[str, ...] = ()
    cited_turns: tuple[str, ...] = ()
    """The turn ids behind the unit (a fact's source turns; a section's facts' source turns)."""


def parse_units(spec) -> tuple[str, ...]:
    """``"turns,facts"`` (or a sequence) -> ``("turns", "facts")`` in :data:`UNIT_KINDS` order;
    ``ConfigError`` naming ``units`` for an unknown layer, a repeat or a set without turns."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    bad = [s for s in items if s not in UNIT_KINDS]
    if bad or not items:
        raise ConfigError(f"units: unknown layer {bad[0] if bad else ''!r} (choose from {', '.join(UNIT_KINDS)}, "
                          f"comma-separated)")
    if len(set(items)) != len(items):
        raise ConfigError(f"units: {items} names a layer twice")
    if "turns" not in items:
        raise ConfigError("units: must include 'turns' (facts and profiles point at turns)")
    return tuple(k for k in UNIT_KINDS if k in items)


def fact_embed_text(fact: Fact, timestamp: str) -> str:
    """What the encoder sees of a fact: its session date, then its text (as ``Turn.embed_text``)."""
    return f"[{timestamp}] {fact.text}"


def profile_embed_text(p: ProfileSection) -> str:
    """What the encoder sees of a profile section."""
    return f"{p.person}, {p.section.replace('_', ' ')}: {p.text()}"


def _normalize(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)


def fact_session(fact: Fact, turn_by_id: dict[str, Turn]) -> int:
    """The session a fact's unit sits in: its ``session`` when it names one, else its first source turn's."""
    if fact.session is not None:
        try:
            return int(fact.session)
        except ValueError:
            pass
    return turn_by_id[fact.source_turns[0]].session


def unit_view(bank: Bank, units=DEFAULT_UNITS) -> Bank:
    """The bank as selection sees it with ``units`` (see the module docstring); ``ConfigError``
    when a layer asked for is empty in the bank (build it with ``--facts`` / ``--profiles``)."""
    units = parse_units(units)
    if units == DEFAULT_UNITS:
        return bank
    for layer in units[1:]:
        if not getattr(bank, layer):
            raise ConfigError(f"units: bank {bank.bank_id!r} has no {layer} (build it with --{layer})")
    turn_by_id = {t.turn_id: t for t in bank.turns}
    uthread = bank.unit_thread
    tindex = bank.index_of()
    new_units: list[LayerUnit] = []
    vecs: list[np.ndarray] = [bank.unit_vecs]
    offsets = list(bank.thread_offsets)
    heads, kinds, hvecs = list(bank.heads), list(bank.head_kind), [bank.head_vecs]
    edges: list[tuple[int, int]] = []
    links: list[tuple[int, int]] = []
    N, J = bank.n_units, bank.n_threads
    fact_unit: dict[str, int] = {}
    fact_by_id = {f.fact_id: f for f in bank.facts}

    def add_thread(members: list[tuple[LayerUnit, np.ndarray]], head: str, targets: set[int]) -> None:
        j = len(heads)
        for u, _ in members:
            new_units.append(u)
        block = np.stack([v for _, v in members])
        vecs.append(block)
        offsets.append(offsets[-1] + len(members))
        heads.append(head)
        kinds.append("extractive")
        hvecs.append(_normalize(block.mean(axis=0))[None, :])
        edges.extend((j, t) for t in sorted(targets) if t != j)

    if "facts" in units:
        order = sorted(range(len(bank.facts)), key=lambda i: (fact_session(bank.facts[i], turn_by_id), i))
        by_session: dict[int, list[int]] = {}
        for i in order:
            by_session.setdefault(fact_session(bank.facts[i], turn_by_id), []).append(i)
        for s, idx in by_session.items():
            members, targets = [], set()
            for i in idx:
                f = bank.facts[i]
                src = turn_by_id[f.source_turns[0]]
                u = LayerUnit(f.fact_id, FACT_SPEAKER, f.text, s, src.timestamp, src.time, None, "facts",
                              f.source_turns, f.source_turns)
                fact_unit[f.fact_id] = N + len(new_units) + len(members)
                members.append((u, bank.fact_vecs[i]))
                for t in f.source_turns:
                    links.append((fact_unit[f.fact_id], tindex[t]))
                    targets.add(int(uthread[tindex[t]]))
            add_thread(members, f"[{members[0][0].timestamp}] facts of session {s}", targets)
    if "profiles" in units:
        pidx = sorted(range(len(bank.profiles)), key=lambda i: (bank.profiles[i].person,
                                                              SECTIONS.index(bank.profiles[i].section)))
        by_person: dict[str, list[int]] = {}
        for i in pidx:
            by_person.setdefault(bank.profiles[i].person, []).append(i)
        unit_thread_of = _thread_lookup(offsets)
        for person, idx in by_person.items():
            members, targets, plinks = [], set(), []
            for i in idx:
                p = bank.profiles[i]
                turns = tuple(dict.fromkeys(t for f in p.fact_ids for t in fact_by_id[f].source_turns))
                u = LayerUnit(p.unit_id, PROFILE_SPEAKER, f"{p.person}, {p.section.replace('_', ' ')}: {p.text()}",
                              -1, "profile", None, None, "profiles", p.fact_ids, turns)
                me = N + len(new_units) + len(members)
                members.append((u, bank.profile_vecs[i]))
                cited = [fact_unit[f] for f in p.fact_ids] if "facts" in units else [tindex[t] for t in turns]
                for c in cited:
                    plinks.append((me, c))
                    targets.add(unit_thread_of(c))
            add_thread(members, f"profile of {person}", targets)
            links.extend(plinks)
    src, dst, w, kind = _with_layer_edges(bank, edges)
    lsrc = np.array([a for a, _ in links], dtype=np.int64)
    ldst = np.array([b for _, b in links], dtype=np.int64)
    view = replace(bank, turns=list(bank.turns) + new_units, thread_offsets=np.array(offsets, dtype=np.int64),
                   heads=heads, head_kind=kinds, unit_vecs=np.concatenate(vecs).astype(np.float32),
                   head_vecs=np.concatenate(hvecs).astype(np.float32), edge_src=src, edge_dst=dst, edge_w=w,
                   edge_kind=kind, facts=(), fact_vecs=None, profiles=(), profile_vecs=None, units=units,
                   support_src=lsrc, support_dst=ldst)
    view.validate()
    assert view.n_threads >= J
    return view


def _thread_lookup(offsets: list[int]):
    off = np.asarray(offsets, dtype=np.int64)
    return lambda u: int(np.searchsorted(off, u, side="right") - 1)


def _with_layer_edges(bank: Bank, edges: list[tuple[int, int]]):
    """The bank's edges plus the layer edges, in both directions, sorted by (src, dst)."""
    a = np.array([e[0] for e in edges] + [e[1] for e in edges], dtype=np.int64)
    b = np.array([e[1] for e in edges] + [e[0] for e in edges], dtype=np.int64)
    src = np.concatenate([bank.edge_src.astype(np.int64), a])
    dst = np.concatenate([bank.edge_dst.astype(np.int64), b])
    w = np.concatenate([bank.edge_w.astype(np.float32), np.ones(len(a), dtype=np.float32)])
    kind = np.concatenate([bank.edge_kind.astype(np.int8), np.full(len(a), LAYER, dtype=np.int8)])
    order = np.lexsort((dst, src))
    return src[order], dst[order], w[order], kind[order]


def layer_counts(units_or_turns) -> dict[str, int]:
    """How many units of each layer a list of units (``Turn`` / ``LayerUnit``) holds: the mix."""
    out = {k: 0 for k in UNIT_KINDS}
    for u in units_or_turns:
        out[getattr(u, "layer", "turns")] += 1
    return out
