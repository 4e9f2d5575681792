"""The ingest layers of a bank beside its turns (facts, profiles, the next one), each declared once.

A layer is one module here that registers a :class:`~.base.Layer` at import: its record type,
its vectors' tensor name, how it is checked, forgotten and laid into a unit view. Importing this
package imports every module of it, so a new layer is one new file. The store (``store.bank``'s
checks, ``store.files``, ``store.segments``, ``store.view``), ``ingest.forget``,
``memory.history`` and ``select.engine.extend`` iterate :data:`LAYERS` and name no layer; the
build steps of a layer (how it is made from the turns, with an LLM or an input file) are
ingest's (``ingest.layers.steps``), since the store comes before ingest.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace

from .base import REGISTRY, Layer, LayerUnit, ViewContext, ViewThread, register  # noqa: F401

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):  # each layer module registers its layer
    if _m != "base":
        importlib.import_module(f"{__name__}.{_m}")

LAYERS: tuple[Layer, ...] = tuple(sorted(REGISTRY.values(), key=lambda x: x.position))
"""Every layer, in their one order (``position``): of ``units`` tuples, the files and the view."""
LAYER_BY_NAME: dict[str, Layer] = {x.name: x for x in LAYERS}
UNIT_KINDS: tuple[str, ...] = ("turns",) + tuple(x.name for x in LAYERS)
"""The layers a view may take as units, in the order they stand in it."""


def _check() -> None:
    """Refuse a registry the store could not read: a shared position or tensor name, a layer
    requiring one that is not registered or comes after it."""
    for what in ("position", "tensor"):
        seen: dict = {}
        for x in LAYERS:
            if getattr(x, what) in seen:
                raise ValueError(f"layers {seen[getattr(x, what)]!r} and {x.name!r} share the {what} "
                                 f"{getattr(x, what)!r}")
            seen[getattr(x, what)] = x.name
    for x in LAYERS:
        for r in x.requires:
            if r not in LAYER_BY_NAME or LAYER_BY_NAME[r].position >= x.position:
                raise ValueError(f"layer {x.name!r} requires {r!r}, which is not a layer before it")


_check()


def empty_fields() -> dict:
    """The ``Bank`` keyword arguments of no layer at all (a view, a bank's tail)."""
    out: dict = {"more_layers": {}}
    for x in LAYERS:
        if x.field is not None:
            out.update(x.fields((), None))
    return out


def layer_fields(values: dict) -> dict:
    """The ``Bank`` keyword arguments holding ``values`` (layer name -> ``(items, vectors)``)."""
    out: dict = {"more_layers": {}}
    for x in LAYERS:
        items, vecs = values.get(x.name, ((), None))
        out.update(x.fields(items, vecs, out["more_layers"]))
    return out


def has_layers(bank) -> bool:
    """Whether ``bank`` holds an item of any layer."""
    return any(len(x.items(bank)) for x in LAYERS)


def unit_vectors(bank) -> dict:
    """Unit id -> its vector, for every layer item of ``bank``."""
    out: dict = {}
    for x in LAYERS:
        items, vecs = x.items(bank), x.vecs(bank)
        if items and vecs is not None:
            out.update({x.unit_id(it): v for it, v in zip(items, vecs)})
    return out


def without_units(old, new, drop: set):
    """``new`` with ``old``'s layers less what cites a gone unit: in :data:`LAYERS` order, each
    layer keeps the items its ``forget`` keeps (by default those citing none of ``drop`` nor of
    the items an earlier layer dropped); everything kept keeps its vector."""
    if not has_layers(old):
        return new
    gone, values = set(drop), {}
    for x in LAYERS:
        items, vecs = x.items(old), x.vecs(old)
        keep, kept = x.forget_items(items, gone)
        gone |= {x.unit_id(items[k]) for k in set(range(len(items))) - set(keep)}
        values[x.name] = (kept, vecs[keep] if keep else None)
    return replace(new, **layer_fields(values), layer_sources=dict(old.layer_sources))
