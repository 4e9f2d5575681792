"""A new ingest layer is one file (issue 43 item 3): the toy layer ``docs/examples/notes_layer.py``,
copied into a copy of the tree as ``trawmem_gpu/store/layers/notes.py`` and nothing else, is written
and read by the store (its records in ``layers.json``, its vectors a tensor, its count in
``meta.json``), laid into a unit view (``units=("turns", "notes")``), dropped by a forget with the
turn it cites and listed by the history; the copy keeps the layout test's checks."""
from __future__ import annotations

import re
import shutil

import pytest

from tree_copy import ROOT, copy_tree, run_layout_checks, run_python

EXAMPLE = ROOT / "docs" / "examples" / "notes_layer.py"

SCRIPT = '''
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from trawmem_gpu import Memory
from trawmem_gpu.store import Collection
from trawmem_gpu.store.layers import LAYER_BY_NAME, UNIT_KINDS
from trawmem_gpu.store.layers.notes import Note
from trawmem_gpu.store.view import layer_counts, parse_units, unit_view

root = Path("coll")
mem = Memory(root)
turns = [{"turn_id": f"t{i}", "speaker": "Ana", "text": f"Turn {i}: we fixed the bike on the hill.",
          "timestamp": f"2031-05-0{1 + i // 3}T10:00:00"} for i in range(6)]
mem.add("b", turns)
notes = LAYER_BY_NAME["notes"]
rng = np.random.default_rng(0)


def with_notes(old):
    v = rng.normal(size=(3, old.unit_vecs.shape[1])).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return notes.put(old, (Note("N1", "bike note", "t1"), Note("N2", "hill note", "t4"), Note("N3", "x", "t5")), v)


Collection(root).update("b", with_notes)
bank = Collection(root).load("b")
d = Collection(root).bank_path("b")
layers = json.loads((d / "layers.json").read_text())
meta = json.loads((d / "meta.json").read_text())
tensors = load_file(str(d / meta["base"]["files"]["tensors"]))
view = unit_view(bank, parse_units("turns,notes"))
units = [u.turn_id for u in view.turns]
at = {u: i for i, u in enumerate(units)}
links = sorted(zip(view.support_src.tolist(), view.support_dst.tolist()))
mem2 = Memory(root)
before = mem2.history("b", "N1")
mem2.forget("b", ["t1"])
after = Collection(root).load("b")
print("RESULT " + json.dumps({
    "kinds": list(UNIT_KINDS), "items": [n.note_id for n in notes.items(bank)],
    "layers_json": sorted(layers), "notes_json": layers["notes"], "meta_layers": meta["layers"],
    "tensor": list(tensors["note_vecs"].shape), "units": units, "mix": layer_counts(view.turns),
    "links": links, "want_links": sorted([(at["N1"], at["t1"]), (at["N2"], at["t4"]), (at["N3"], at["t5"])]),
    "last_head": view.heads[-1],
    "before": [e["event"] for e in before],
    "after": [(e["event"], e["cause"]) for e in mem2.history("b", "N1")],
    "kept": [n.note_id for n in notes.items(after)], "kept_n2": [e["event"] for e in mem2.history("b", "N2")],
}))
'''


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    tree = copy_tree(tmp_path_factory.mktemp("notes_tree"))
    shutil.copy(EXAMPLE, tree / "trawmem_gpu" / "store" / "layers" / "notes.py")
    return tree


def test_the_example_layer_is_stored_viewed_forgotten_and_listed(tree, tmp_path):
    out = run_python(tree, SCRIPT.replace('Path("coll")', repr(str(tmp_path / "coll")).join(("Path(", ")"))))
    assert out["kinds"] == ["turns", "facts", "profiles", "notes"]
    assert out["items"] == ["N1", "N2", "N3"]
    assert out["layers_json"] == ["facts", "notes", "profiles", "sources"]
    assert out["notes_json"][0] == {"id": "N1", "text": "bike note", "turn": "t1"}
    assert out["meta_layers"] == {"facts": 0, "profiles": 0, "notes": 3} and out["tensor"][0] == 3
    assert out["units"][-3:] == ["N1", "N2", "N3"] and out["mix"]["notes"] == 3 and out["mix"]["turns"] == 6
    assert out["links"] == out["want_links"] and out["last_head"] == "notes"
    assert out["before"] == ["added"]  # written by the store: a unit the history knows
    assert out["after"] == [["forgotten", "cites a forgotten turn"]]  # N1 went with t1; N2, N3 stay
    assert out["kept"] == ["N2", "N3"] and out["kept_n2"] == ["added"]


def test_the_copy_with_the_layer_keeps_the_layout_checks(tree):
    r = run_layout_checks(tree)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"\b1[0-9] passed\b", r.stdout), r.stdout[-2000:]
