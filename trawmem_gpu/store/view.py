"""A bank's unit view for a ``units`` tuple: the layers that selection takes as units.

``unit_view(bank, ("turns",))`` is the bank's burst view (``store.bursts``: each burst of short
messages one unit), which is the bank itself where no burst holds two messages (the engines'
tables and picks are today's); the layers below are laid over the burst view, an item citing a
burst's message pointing at the burst's unit.
With more layers (``store.layers``: facts, profiles, any registered layer), the view is a
:class:`~trawmem_gpu.store.bank.Bank` whose ``turns`` hold the bank's turns and one
:class:`~trawmem_gpu.store.layers.LayerUnit` per item of each layer asked for, so every engine,
the reference and the workspace take it unchanged:

* **threads**: the bank's threads in their order; each layer lays its items out as threads
  (its ``view``: ``store.layers.ViewThread``), each standing after the turn threads of a session
  (the facts: each session's facts after that session's threads, so a workspace shows them under
  the date heading of their turns; a thread never crosses a session) or after every turn thread
  (the profiles: one thread per person), layers in their order. A layer thread's head vector is
  the normalized mean of its units' vectors; unit vectors are the layer's. Turn and thread
  indices therefore differ from the bank's (ids do not);
* **thread graph**: the bank's edges, plus a ``LAYER`` edge (weight 1, both directions) between a
  layer thread and every thread holding a unit one of its units cites;
* **support links** (``support_src`` / ``support_dst``): each layer unit restates the units it
  cites (a fact its source turns, a profile section its facts); an id of a layer that is not
  among the units is followed to what it cites (a section's facts' source turns when the facts are
  not units). The support kernel K reads them (``select.objective.support_kernel``).

Before the layout each layer with a ``dated`` narrows the bank to the items that hold (the facts:
the current ones, or those valid ``as_of``: ``store.layers.facts.facts_at``).
A view is never stored (``store.files`` refuses it) and holds no layers of its own (they are units).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .graph import LAYER
from ..errors import ConfigError
from .bank import Bank
from .bursts import burst_view, unit_members
from .layers import LAYER_BY_NAME, LAYERS, UNIT_KINDS, LayerUnit, ViewContext, empty_fields  # noqa: F401
from .layers.facts import FACT_SPEAKER, fact_embed_text, fact_session, facts_at  # noqa: F401
from .layers.profiles import PROFILE_SPEAKER, profile_embed_text  # noqa: F401

DEFAULT_UNITS: tuple[str, ...] = ("turns",)


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
        raise ConfigError("`units` must include 'turns' (every layer points at turns)")
    return tuple(k for k in UNIT_KINDS if k in items)


def _normalize(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)


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
        if not len(LAYER_BY_NAME[layer].items(bank)):
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
    for x in LAYERS:
        if x.dated is not None:
            bank = x.dated(bank, as_of)
    order, ctx = _view_order(bank, units)
    off = bank.thread_offsets
    # where everything stands: bank turn -> view unit, bank thread -> view thread, layer unit id -> view unit
    sizes = [int(off[key + 1] - off[key]) if kind == "t" else len(key[1].units) for kind, key in order]
    voff = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    umap = np.empty(bank.n_units, dtype=np.int64)
    tmap = np.empty(bank.n_threads, dtype=np.int64)
    unit_of: dict[str, int] = {}
    for j, (kind, key) in enumerate(order):
        if kind == "t":
            umap[off[key]:off[key + 1]] = np.arange(voff[j], voff[j + 1])
            tmap[key] = j
        else:
            unit_of.update({u.turn_id: int(voff[j]) + k for k, u in enumerate(key[1].units)})
    tindex = {m: i for i, t in enumerate(bank.turns) for m in unit_members(t)}
    new_turns, vecs, heads, kinds, hvecs = [], [], [], [], []
    edges: list[tuple[int, int]] = []
    links: list[tuple[int, int]] = []
    for j, (kind, key) in enumerate(order):
        if kind == "t":
            lo, hi = int(off[key]), int(off[key + 1])
            new_turns += bank.turns[lo:hi]
            vecs.append(bank.unit_vecs[lo:hi])
            heads.append(bank.heads[key])
            kinds.append(bank.head_kind[key])
            hvecs.append(bank.head_vecs[key:key + 1])
            continue
        layer, th = key
        block = layer.vecs(bank)[list(th.rows)]
        targets = set()
        for k, u in enumerate(th.units):
            cited = [unit_of[c] if c in unit_of else int(umap[tindex[c]]) for c in _in_view(u.cites, unit_of, ctx)]
            links += [(int(voff[j]) + k, c) for c in cited]
            targets |= {int(np.searchsorted(voff, c, side="right") - 1) for c in cited}
        new_turns += list(th.units)
        vecs.append(block)
        heads.append(th.head)
        kinds.append("extractive")
        hvecs.append(_normalize(block.mean(axis=0))[None, :])
        edges += [(j, t) for t in sorted(targets) if t != j]
    src, dst, w, kind = _with_layer_edges(tmap[bank.edge_src], tmap[bank.edge_dst], bank, edges)
    view = replace(bank, turns=new_turns, thread_offsets=voff, heads=heads,
                   head_kind=kinds, unit_vecs=np.concatenate(vecs).astype(np.float32),
                   head_vecs=np.concatenate(hvecs).astype(np.float32), edge_src=src, edge_dst=dst, edge_w=w,
                   edge_kind=kind, units=units, **empty_fields(),
                   support_src=np.array([a for a, _ in links], dtype=np.int64),
                   support_dst=np.array([b for _, b in links], dtype=np.int64),
                   knn_sims=None, knn_ids=None, extends=None)  # the stored bank's graph table is not the view's
    view.validate()
    return view


def _in_view(cites, unit_of: dict, ctx: ViewContext) -> tuple[str, ...]:
    """The ids ``cites`` names, each a unit of the view: a turn's or a layer unit's id as it is,
    an id of a layer that is not among the units followed to the turns behind it (then each once)."""
    if all(c in unit_of or c not in ctx.cites_of for c in cites):
        return tuple(cites)
    return ctx.turns_behind(cites)


def _view_order(bank: Bank, units: tuple[str, ...]):
    """``(order, ctx)``: ``("t", bank thread)`` or ``("l", (layer, ViewThread))`` in view order,
    each layer thread after the turn threads of its session (or after all of them)."""
    turn_by_id = {m: t for t in bank.turns for m in unit_members(t)}  # a burst's members: its unit
    cites_of = {x.unit_id(it): tuple(x.cites(it)) for x in LAYERS for it in x.items(bank)}
    ctx = ViewContext(bank, turn_by_id, cites_of)
    after: dict[object, list] = {}
    for name in units[1:]:
        x = LAYER_BY_NAME[name]
        for th in x.view(x.items(bank), ctx):
            after.setdefault(th.session, []).append(("l", (x, th)))
    J, off = bank.n_threads, bank.thread_offsets
    sess = [bank.turns[int(off[j])].session for j in range(J)]
    order: list[tuple[str, object]] = []
    for j in range(J):
        order.append(("t", j))
        if j == J - 1 or sess[j + 1] != sess[j]:
            order += after.pop(sess[j], [])
    return order + after.pop(None, []), ctx


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
