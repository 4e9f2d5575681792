"""What an ingest layer declares (:class:`Layer`), the units it lays into a unit view
(:class:`LayerUnit`, :class:`ViewThread`) and the registry (:func:`register`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ...data.types import Turn


@dataclass(frozen=True)
class LayerUnit(Turn):
    """A layer's item (a fact, a profile section) as a unit of a view: a ``Turn`` (what the engines
    read) that knows its layer and the ids it cites (a fact: its source turns; a section: its
    facts). It has no metadata of its own: a selection filter passes it when every turn behind it
    (``cited_turns``) passes (``select.restrict.unit_mask``)."""

    layer: str = "facts"
    cites: tuple[str, ...] = ()
    cited_turns: tuple[str, ...] = ()
    """The turn ids behind the unit (a fact's source turns; a section's facts' source turns)."""


@dataclass(frozen=True)
class ViewThread:
    """One thread a layer lays into a unit view: its units (in order, each with its row of the
    layer's vectors), its head line, and where it stands: after the threads of session
    ``session``, or (None) after every turn thread."""

    units: tuple[LayerUnit, ...]
    rows: tuple[int, ...]
    """Each unit's row in the layer's items and vectors."""
    head: str
    session: int | None = None


@dataclass(frozen=True)
class ViewContext:
    """What a layer's ``view`` reads besides its items: the bank's turns by id (a burst's members:
    its unit) and :meth:`turns_behind` (the turn ids behind the ids an item cites)."""

    bank: object
    turn_by_id: dict
    cites_of: dict
    """Unit id -> the ids it cites, for every layer's items of the bank."""

    def turns_behind(self, ids) -> tuple[str, ...]:
        """The turn ids behind ``ids``: a turn id itself, a layer item's id its cited turns (each
        once, in order, when any id had to be followed)."""
        out, followed = [], False
        for c in ids:
            if c in self.cites_of:
                followed = True
                out += self.turns_behind(self.cites_of[c])
            else:
                out.append(c)
        return tuple(dict.fromkeys(out)) if followed else tuple(out)


@dataclass(frozen=True)
class Layer:
    """An ingest layer: the records beside a bank's turns that a unit view can take as units.

    Everything the store, forget, history and the view know of a layer is here; they iterate
    :data:`~trawmem_gpu.store.layers.LAYERS` and name none. Its items live on the bank in the
    fields ``field`` / ``vecs_field`` when the ``Bank`` declares them (facts, profiles), else in
    ``Bank.more_layers[name]`` (a new layer needs no ``Bank`` field)."""

    name: str
    """The layer's name: ``units=`` names it, ``layers.json`` and ``layer_sources`` key it."""
    record: type
    """The type of its items (``store.facts.Fact``)."""
    position: int
    """Its place: in ``units`` tuples, the files and the view (facts 10, profiles 20)."""
    noun: str
    """One item, in messages (``fact``)."""
    unit_id: Callable
    """item -> its unit id (bank-unique, never a turn id)."""
    cites: Callable
    """item -> the ids it cites: turn ids, or unit ids of the layers it ``requires``."""
    to_record: Callable
    """item -> its JSON record in ``layers.json``."""
    from_record: Callable
    """JSON record -> item (``ValueError`` naming a bad field)."""
    view: Callable
    """``(items, ctx: ViewContext) -> [ViewThread]``: its threads in a unit view."""
    tensor: str
    """The name of its vectors in the tensors file (``fact_vecs``)."""
    text: Callable | None = None
    """item -> its text, which a forget erases from the caches with the item (``memory.erase``)."""
    requires: tuple[str, ...] = ()
    """The layers its items cite (profiles: facts); built after them."""
    field: str | None = None
    vecs_field: str | None = None
    always: bool = False
    """Written in ``layers.json`` (and counted in ``meta.json``) even when empty, once the bank has
    any layer (the facts and profiles: format 3's layout)."""
    forget: Callable | None = None
    """``(items, gone: set) -> (kept rows, kept items)``: the items left once the units ``gone``
    went (None: those that cite none of them, unchanged)."""
    dated: Callable | None = None
    """``(bank, as_of) -> bank``: the bank with the items that hold at ``as_of`` (None: all hold)."""
    check: Callable | None = None
    """``(bank, items, ids) -> None``: checks of its own beyond the common ones (``ValueError``)."""
    changes: Callable | None = None
    """``(old items, new items) -> [(unit id, event, by)]``: what a forget did to kept items besides
    dropping some (``memory.history``; facts: reinstated or superseded anew)."""

    def items(self, bank) -> tuple:
        """The layer's items in ``bank`` (the very object it holds: an append that keeps them is seen)."""
        if self.field is not None:
            return getattr(bank, self.field)
        return bank.more_layers.get(self.name, ((), None))[0]

    def vecs(self, bank) -> np.ndarray | None:
        if self.vecs_field is not None:
            return getattr(bank, self.vecs_field)
        return bank.more_layers.get(self.name, ((), None))[1]

    def fields(self, items, vecs, more: dict | None = None) -> dict:
        """The ``Bank`` keyword arguments that hold ``items`` and ``vecs`` (``more``: the
        ``more_layers`` dict being filled, for a layer without fields of its own)."""
        if self.field is not None:
            return {self.field: tuple(items), self.vecs_field: vecs}
        more = dict(more or {})
        if len(items):
            more[self.name] = (tuple(items), vecs)
        else:
            more.pop(self.name, None)
        return {"more_layers": more}

    def put(self, bank, items, vecs):
        """``bank`` with this layer's items and vectors replaced."""
        return replace(bank, **self.fields(items, vecs, bank.more_layers))

    def forget_items(self, items, gone: set) -> tuple[list[int], list]:
        if self.forget is not None:
            return self.forget(items, gone)
        keep = [k for k, x in enumerate(items) if not set(self.cites(x)) & gone]
        return keep, [items[k] for k in keep]


REGISTRY: dict[str, Layer] = {}


def register(layer: Layer) -> Layer:
    """Add ``layer`` to the registry (a layer module calls it once, at import)."""
    if layer.name in REGISTRY or layer.name == "turns":
        raise ValueError(f"layer {layer.name!r} is registered twice")
    REGISTRY[layer.name] = layer
    return layer
