"""A bank's unit view for a ``units`` tuple: the layers that selection takes as units.

``unit_view(bank, ("turns",))`` is the bank's burst view (``store.bursts``: each burst of short
messages one unit), which is the bank itself where no burst holds two messages (the engines'
tables and picks are today's); the layers below are laid over the burst view, a fact citing a
burst's message pointing at the burst's unit.
With more layers, the view is a :class:`~trawmem_gpu.store.bank.Bank` whose ``turns`` hold the
bank's turns and one :class:`LayerUnit` per fact and per profile section, so every engine, the
reference and the workspace take it unchanged:

* **threads**: the bank's threads in their order, each session's followed by one fact thread
  holding the facts whose (first) source turn is in that session (a thread never crosses a
  session), so a workspace shows a session's facts under the date heading of its turns; then one
  profile thread per person (sections in :data:`~trawmem_gpu.store.facts.SECTIONS` order). A
  layer thread's head vector is the normalized mean of its units' vectors; unit vectors are the
  bank's (``unit_vecs``, ``fact_vecs``, ``profile_vecs``). Turn and thread indices therefore
  differ from the bank's (ids do not);
* **a fact's unit** has the fact's first person as its speaker (the ``learned`` affinity's
  ``speaker_named`` feature sees who it is about; its line shows no speaker:
  ``select.workspace.unit_line``), its source turn's date and session;
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
from datetime import datetime, timezone

import numpy as np

from .graph import LAYER
from ..data.types import Turn
from ..errors import ConfigError
from .bank import Bank
from .bursts import burst_view, unit_members
from .facts import SECTIONS, Fact, ProfileSection

UNIT_KINDS: tuple[str, ...] = ("turns", "facts", "profiles")
"""The layers a view may take as units, in the order they stand in it."""
DEFAULT_UNITS: tuple[str, ...] = ("turns",)
FACT_SPEAKER, PROFILE_SPEAKER = "fact", "profile"


@dataclass(frozen=True)
class LayerUnit(Turn):
    """A fact or profile section as a unit of a view: a ``Turn`` (what the engines read) that
    knows its layer and the ids it cites (a fact: its source turns; a section: its facts). It has
    no metadata of its own: a selection filter passes it when every turn behind it
    (``cited_turns``) passes (``select.restrict.unit_mask``)."""

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
        raise ConfigError(f"`units`: unknown layer {bad[0] if bad else ''!r} (choose from {', '.join(UNIT_KINDS)}, "
                          f"comma-separated)")
    if len(set(items)) != len(items):
        raise ConfigError(f"`units`: {items} names a layer twice")
    if "turns" not in items:
        raise ConfigError("`units` must include 'turns' (facts and profiles point at turns)")
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
    """The session a fact's unit sits in: its first source turn's (a thread never crosses a session)."""
    return turn_by_id[fact.source_turns[0]].session


def facts_at(bank: Bank, as_of: str | None = None) -> Bank:
    """``bank`` with the facts that hold (``Fact.valid_at``, in UTC): the current ones (``as_of``
    None: not superseded and started by now, the later of the clock's and the newest turn's
    time), or those valid at ``as_of`` (an ISO date: the end
    of that day; a date-time: that instant); profile lines keep the ids of the facts kept. The
    bank itself when every fact holds."""
    if not bank.facts:
        return bank
    now = None
    if as_of is None:  # the later of the clock's now and the bank's newest turn (``store.facts``)
        now = max([datetime.now(timezone.utc).replace(tzinfo=None), *(t.time for t in bank.turns if t.time)])
    keep = [i for i, f in enumerate(bank.facts) if f.valid_at(as_of, now)]
    if len(keep) == len(bank.facts):
        return bank
    ids = {bank.facts[i].fact_id for i in keep}
    profiles = tuple(replace(p, lines=tuple(replace(ln, fact_ids=tuple(x for x in ln.fact_ids if x in ids))
                                            for ln in p.lines)) for p in bank.profiles)
    return replace(bank, facts=tuple(bank.facts[i] for i in keep),
                   fact_vecs=bank.fact_vecs[keep] if keep else None, profiles=profiles)


def check_layers(bank: Bank | None, units, bank_id: str | None = None) -> None:
    """``ConfigError`` when a layer of ``units`` is empty in ``bank`` (None: a bank an add would
    create, which has only turns): an engine could not select from it. A write checks this
    before anything is written (``memory.core.MemoryCore.append``)."""
    bank_id = bank.bank_id if bank is not None else bank_id
    for layer in parse_units(units)[1:]:
        if bank is None:
            raise ConfigError(f"`units`: bank {bank_id!r} does not exist, and a bank an add creates has no {layer}: "
                              f"this Memory selects from {layer} too (`units`); create the bank through one "
                              f"with units ('turns',), or build it with its `{layer}` layer (nothing was stored)")
        if not getattr(bank, layer):
            raise ConfigError(f"`units`: bank {bank_id!r} has no {layer} (build it with its `{layer}` layer)")


def unit_view(bank: Bank, units=DEFAULT_UNITS, as_of: str | None = None) -> Bank:
    """The bank as selection sees it with ``units`` (see the module docstring); ``ConfigError``
    when a layer asked for is empty in the bank (build it with ``--facts`` / ``--profiles``).
    Facts that no longer hold are not units: only the current ones, or with ``as_of`` (an ISO
    date) those valid on that day (:func:`facts_at`)."""
    units = parse_units(units)
    bank = burst_view(bank)
    if units == DEFAULT_UNITS:
        return bank
    check_layers(bank, units)
    bank = facts_at(bank, as_of)
    lay = _layout(bank, units)
    new_turns, vecs, offsets, heads, kinds, hvecs = [], [], [0], [], [], []
    edges: list[tuple[int, int]] = []
    links: list[tuple[int, int]] = []
    off = bank.thread_offsets
    for j, (kind, key) in enumerate(lay.order):
        if kind == "t":
            lo, hi = int(off[key]), int(off[key + 1])
            new_turns += bank.turns[lo:hi]
            vecs.append(bank.unit_vecs[lo:hi])
            heads.append(bank.heads[key])
            kinds.append(bank.head_kind[key])
            hvecs.append(bank.head_vecs[key:key + 1])
            offsets.append(offsets[-1] + hi - lo)
            continue
        members, head, cites, targets = (_fact_thread(lay, key) if kind == "f"
                                         else _profile_thread(lay, key, offsets[-1]))
        links += cites
        block = np.stack([v for _, v in members])
        new_turns += [u for u, _ in members]
        vecs.append(block)
        offsets.append(offsets[-1] + len(members))
        heads.append(head)
        kinds.append("extractive")
        hvecs.append(_normalize(block.mean(axis=0))[None, :])
        edges += [(j, t) for t in sorted(targets) if t != j]
    src, dst, w, kind = _with_layer_edges(lay.tmap[bank.edge_src], lay.tmap[bank.edge_dst], bank, edges)
    view = replace(bank, turns=new_turns, thread_offsets=np.array(offsets, dtype=np.int64), heads=heads,
                   head_kind=kinds, unit_vecs=np.concatenate(vecs).astype(np.float32),
                   head_vecs=np.concatenate(hvecs).astype(np.float32), edge_src=src, edge_dst=dst, edge_w=w,
                   edge_kind=kind, facts=(), fact_vecs=None, profiles=(), profile_vecs=None, units=units,
                   support_src=np.array([a for a, _ in links], dtype=np.int64),
                   support_dst=np.array([b for _, b in links], dtype=np.int64),
                   knn_sims=None, knn_ids=None, extends=None)  # the stored bank's graph table is not the view's
    view.validate()
    return view


@dataclass
class _Layout:
    """Where everything of ``bank`` stands in its view (see :func:`_layout`)."""

    bank: Bank
    units: tuple[str, ...]
    order: list[tuple[str, object]]
    """("t", bank thread) | ("f", session) | ("p", person), in view order."""
    by_session: dict[int, list[int]]
    """session -> its facts' indices in ``bank.facts``."""
    by_person: dict[str, list[int]]
    """person -> their profile sections' indices in ``bank.profiles``, in ``SECTIONS`` order."""
    umap: np.ndarray
    """bank turn -> view unit."""
    tmap: np.ndarray
    """bank thread -> view thread."""
    fact_unit: dict[str, int]
    """fact id -> view unit."""
    voff: np.ndarray
    """the view's thread offsets."""
    turn_by_id: dict[str, Turn]
    tindex: dict[str, int]
    fact_by_id: dict[str, Fact]


def _view_order(bank: Bank, units: tuple[str, ...], turn_by_id: dict[str, Turn]):
    """``(order, by_session, by_person)`` of :class:`_Layout`: each session's threads followed by
    its fact thread, then one profile thread per person."""
    J, off = bank.n_threads, bank.thread_offsets
    sess = [bank.turns[int(off[j])].session for j in range(J)]
    by_session: dict[int, list[int]] = {}
    if "facts" in units:
        for i, f in enumerate(bank.facts):
            by_session.setdefault(fact_session(f, turn_by_id), []).append(i)
    order: list[tuple[str, object]] = []
    for j in range(J):
        order.append(("t", j))
        if (j == J - 1 or sess[j + 1] != sess[j]) and sess[j] in by_session:
            order.append(("f", sess[j]))
    by_person: dict[str, list[int]] = {}
    if "profiles" in units:
        for i in sorted(range(len(bank.profiles)), key=lambda i: (bank.profiles[i].person,
                                                                  SECTIONS.index(bank.profiles[i].section))):
            by_person.setdefault(bank.profiles[i].person, []).append(i)
        order += [("p", person) for person in by_person]
    return order, by_session, by_person


def _layout(bank: Bank, units: tuple[str, ...]) -> _Layout:
    """Place every unit: bank turn -> view unit, bank thread -> view thread, fact id -> view unit."""
    turn_by_id = {m: t for t in bank.turns for m in unit_members(t)}  # a burst's members: its unit
    order, by_session, by_person = _view_order(bank, units, turn_by_id)
    off = bank.thread_offsets
    umap = np.empty(bank.n_units, dtype=np.int64)
    tmap = np.empty(bank.n_threads, dtype=np.int64)
    fact_unit: dict[str, int] = {}
    n = 0
    for j, (kind, key) in enumerate(order):
        if kind == "t":
            umap[off[key]:off[key + 1]] = np.arange(n, n + off[key + 1] - off[key])
            tmap[key] = j
            n += int(off[key + 1] - off[key])
        elif kind == "f":
            for i in by_session[key]:
                fact_unit[bank.facts[i].fact_id] = n
                n += 1
        else:
            n += len(by_person[key])
    return _Layout(bank, units, order, by_session, by_person, umap, tmap, fact_unit,
                   _view_offsets(order, off, by_session, by_person), turn_by_id,
                   {m: i for i, t in enumerate(bank.turns) for m in unit_members(t)},
                   {f.fact_id: f for f in bank.facts})


def _fact_thread(lay: _Layout, session: int):
    """``(members, head, links, targets)`` of a session's fact thread: its ``(unit, vector)`` pairs,
    its head line, its support links (fact unit, source turn unit) and the view threads of its
    facts' source turns."""
    bank, members, links, targets = lay.bank, [], [], set()
    for i in lay.by_session[session]:
        f = bank.facts[i]
        src = lay.turn_by_id[f.source_turns[0]]
        members.append((LayerUnit(f.fact_id, f.persons[0] if f.persons else FACT_SPEAKER, f.text, session,
                                  src.timestamp, src.time, None, layer="facts", cites=f.source_turns,
                                  cited_turns=f.source_turns), bank.fact_vecs[i]))
        for t in f.source_turns:
            links.append((lay.fact_unit[f.fact_id], int(lay.umap[lay.tindex[t]])))
            targets.add(int(lay.tmap[bank.unit_thread[lay.tindex[t]]]))
    return members, f"[{members[0][0].timestamp}] facts of session {session}", links, targets


def _profile_thread(lay: _Layout, person: str, first: int):
    """``(members, head, links, targets)`` of ``person``'s profile thread, whose first unit is view
    unit ``first``: its sections cite their facts' units (without the facts layer, their source
    turns' units)."""
    bank, members, links, targets = lay.bank, [], [], set()
    me = first
    for i in lay.by_person[person]:
        p = bank.profiles[i]
        turns = tuple(dict.fromkeys(t for fid in p.fact_ids for t in lay.fact_by_id[fid].source_turns))
        members.append((LayerUnit(p.unit_id, PROFILE_SPEAKER, profile_embed_text(p), -1, "profile", None,
                                  None, layer="profiles", cites=p.fact_ids, cited_turns=turns), bank.profile_vecs[i]))
        cited = [lay.fact_unit[fid] for fid in p.fact_ids] if "facts" in lay.units \
            else [int(lay.umap[lay.tindex[t]]) for t in turns]
        links += [(me, c) for c in cited]
        targets |= {int(np.searchsorted(lay.voff, c, side="right") - 1) for c in cited}
        me += 1
    return members, f"profile of {person}", links, targets


def _view_offsets(order, off, by_session, by_person) -> np.ndarray:
    """The view's thread offsets for ``order`` (see :func:`unit_view`)."""
    sizes = [int(off[k + 1] - off[k]) if kind == "t" else len(by_session[k] if kind == "f" else by_person[k])
             for kind, k in order]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _with_layer_edges(src0: np.ndarray, dst0: np.ndarray, bank: Bank, edges: list[tuple[int, int]]):
    """The bank's edges (their threads renumbered: ``src0`` / ``dst0``) plus the layer edges, in both
    directions, sorted by (src, dst)."""
    a = np.array([e[0] for e in edges] + [e[1] for e in edges], dtype=np.int64)
    b = np.array([e[1] for e in edges] + [e[0] for e in edges], dtype=np.int64)
    src = np.concatenate([src0.astype(np.int64), a])
    dst = np.concatenate([dst0.astype(np.int64), b])
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
