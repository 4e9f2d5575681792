"""A toy ingest layer, the worked example of docs/architecture.md ("An ingest layer"): one note per
turn it cites. Copied to ``trawmem_gpu/store/layers/notes.py`` it is a layer of its own, and nothing
else changes: the store writes and reads it (``layers.json``, the tensor ``note_vecs``), a unit view
takes it as units (``units=("turns", "notes")``: one thread after every turn thread), a forget drops
the notes citing a forgotten turn, and the history lists them (``tests/store/test_layer_example.py``
holds it). Its build step, if it had one, would be a ``Step`` in ``ingest/layers/steps.py``."""
from __future__ import annotations

from dataclasses import dataclass

from .base import Layer, LayerUnit, ViewThread, register


@dataclass(frozen=True)
class Note:
    """One note on one turn."""

    note_id: str
    text: str
    turn_id: str

    def to_record(self) -> dict:
        return {"id": self.note_id, "text": self.text, "turn": self.turn_id}


def note_from_record(r) -> Note:
    """A :class:`Note` from its record; ``ValueError`` naming a bad field."""
    if not isinstance(r, dict):
        raise ValueError(f"a note record must be an object, got {type(r).__name__}")
    for k in ("id", "text", "turn"):
        if not isinstance(r.get(k), str) or not r[k]:
            raise ValueError(f"field {k!r} of a note must be a non-empty string")
    return Note(r["id"], r["text"], r["turn"])


def _view(notes, ctx) -> list[ViewThread]:
    """All notes in one thread, after every turn thread."""
    units = tuple(LayerUnit(n.note_id, "note", n.text, -1, "note", None, None, layer="notes", cites=(n.turn_id,),
                            cited_turns=ctx.turns_behind((n.turn_id,))) for n in notes)
    return [ViewThread(units, tuple(range(len(notes))), "notes", None)] if notes else []


NOTES = register(Layer(
    name="notes", record=Note, position=30, noun="note", unit_id=lambda n: n.note_id, cites=lambda n: (n.turn_id,),
    to_record=Note.to_record, from_record=note_from_record, view=_view, tensor="note_vecs",
    text=lambda n: n.text))
