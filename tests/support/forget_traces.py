"""A history with a marked turn to forget, and the search for its traces in files, caches and an engine."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from trawmem_gpu.data import sample_path


ROOT = Path(__file__).resolve().parents[2]

MARKER = "zqxv-unique-marker-8f3a61c2"

MARKER_ID = "S2:M"

QUESTION = "What is the locker code?"


def _history(tmp_path) -> Path:
    """The sample (bank ``ana-ben``) with one turn carrying MARKER in the middle of session 2, and
    a second bank."""
    lines = [json.loads(x) for x in sample_path().read_text().splitlines() if x.strip()]
    at = next(i for i, r in enumerate(lines) if r["turn_id"] == "S2:4")
    lines.insert(at, {**lines[at], "turn_id": MARKER_ID, "speaker": "Ana",
                      "text": f"My gym locker code, the answer is {MARKER}. Never tell anyone."})
    lines.append({"bank_id": "other", "turn_id": "o1", "speaker": "Zed", "text": "I bought a red kayak.",
                  "timestamp": "2031-05-01T09:00:00"})
    p = tmp_path / "hist.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return p


def _reachable(root, limit: int = 2_000_000):
    """Every NumPy array, torch tensor and string reachable from ``root`` (attributes, dicts,
    sequences), the process's engine tables included."""
    import torch

    seen, stack, arrays, strings = set(), [root], [], []
    while stack and len(seen) < limit:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, type(sys), int, float, bool, type(None), bytes)) or callable(o) \
                and not hasattr(o, "__dict__"):
            continue
        seen.add(id(o))
        if isinstance(o, str):
            strings.append(o)
        elif isinstance(o, torch.Tensor):
            arrays.append(o.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(o, np.ndarray):
            arrays.append(np.ascontiguousarray(o).tobytes())
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, torch.nn.Module):
            continue  # the encoder's weights: not memory
        else:
            if hasattr(o, "__dict__"):
                stack.extend(vars(o).values())
            for s in getattr(type(o), "__slots__", ()):
                if hasattr(o, s):
                    stack.append(getattr(o, s))
    return arrays, strings


def _traces(dirs, needles: dict[str, bytes], mem=None) -> list[str]:
    """``"what in where"`` for every needle found in any file under ``dirs`` (byte by byte) and,
    given a Memory, in its engine's tables and its banks."""
    found = []
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                found += [f"{k} in {p.relative_to(d.parent)}" for k, v in needles.items() if v in data]
    if mem is not None:
        arrays, strings = _reachable(mem)
        blob = b"".join(arrays)
        found += [f"{k} in the engine's arrays" for k, v in needles.items() if v in blob]
        if any(MARKER in s for s in strings):
            found.append("text in the engine's Python objects")
        from trawmem_gpu.tokens import _piece_counts

        if any(MARKER in k for k in _piece_counts):
            found.append("text in the token-count cache")
    return found


def _needles(coll_dir, extra_keys=()) -> dict[str, bytes]:
    from trawmem_gpu.encode.cache import EmbeddingCache
    from trawmem_gpu.store import Collection

    bank = Collection(coll_dir).load("ana-ben")
    i = next(k for k, t in enumerate(bank.turns) if t.turn_id == MARKER_ID)
    t = bank.turns[i]
    key = EmbeddingCache.key(bank.encoder_id, False, t.embed_text())
    v = bank.unit_vecs[i]
    from trawmem_gpu.store.bursts import unit_members
    from trawmem_gpu.store.view import unit_view

    view = unit_view(bank)  # the unit that shows the marker: its own, or the burst it ends up in
    u = next(k for k, t in enumerate(view.turns) if MARKER_ID in unit_members(t))
    out = {"text": MARKER.encode(), "id": MARKER_ID.encode(),  # an id can be the secret too (issue 42.4)
           "embedding key": key.encode(), "vector": v.tobytes(),
           "vector64": v.astype(np.float64).tobytes(),  # as a float64 engine's tables hold it
           "unit32": view.unit_vecs[u].astype(np.float32).tobytes(),  # the engine's vector of its unit
           "unit64": view.unit_vecs[u].astype(np.float64).tobytes()}  # (float32 over float32 banks: Layout.vec_dtype)
    out.update({f"llm key {n}": k.encode() for n, k in enumerate(extra_keys)})
    return out

_KILLED = """
import sys
from trawmem_gpu import Memory
mem = Memory(sys.argv[1])
mem.select("ana-ben", "warm up")
ids = None if sys.argv[2] == "-" else [sys.argv[2]]
mem.forget("ana-ben", ids, outputs=[sys.argv[3]])
print("finished")
"""
