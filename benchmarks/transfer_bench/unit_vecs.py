"""An experiment switch of the transfer bench (issue 36's burst-vector diagnostic): how the vector
of a unit selection sees is formed, per view. Off unless ``TRAWMEM_BENCH_UNIT_VECS`` is set; the
shipped form (``mean``) is never changed.

``TRAWMEM_BENCH_UNIT_VECS="split=encoded,chat=encoded"`` or ``"plain=sentence-mean"``: for each
named view, the form of its units' vectors (a view not named keeps ``mean``):

* ``mean``: as shipped (``store.bursts``): a burst of two or more messages has the normalized mean
  of its messages' vectors, a message alone its stored vector;
* ``encoded``: a burst of two or more messages has its own text encoded as a passage (its
  ``embed_text``: date, speaker, the messages' texts joined by a space, the captions) - what a
  long message of the same words would have; other units keep their stored vectors;
* ``sentence-mean``: every unit whose text has two or more sentences (``data.chat_views.sentences``)
  has the normalized mean of its sentences' vectors, each encoded as the ``split`` view encodes its
  messages (the unit's date and speaker, the caption with the last): the split view's burst vectors
  laid on a set of long messages.

The form is part of a set's view spec (``Run.spec``: the picks' cache keys) and of the fits'
cache keys, and is reported in the sets' statistics. The encoder is the banks' (``BuildConfig``),
through the embedding cache.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

ENV = "TRAWMEM_BENCH_UNIT_VECS"
FORMS = ("mean", "encoded", "sentence-mean")


def forms() -> dict[str, str]:
    """``{view: form}`` from ``TRAWMEM_BENCH_UNIT_VECS`` (empty: every view ``mean``)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in os.environ.get(ENV, "").split(","))):
        view, _, form = part.partition("=")
        if form not in FORMS:
            raise ValueError(f"{ENV}: {part!r} is not VIEW=FORM with FORM one of {', '.join(FORMS)}")
        if form != "mean":
            out[view.strip()] = form
    return out


def form_for(view: str) -> str:
    return forms().get(view, "mean")


@contextmanager
def unit_vectors(view: str):
    """Inside the block, the burst view of ``store.view.unit_view`` (what ``load_labelled`` builds
    the sets' contexts from) has ``view``'s form of unit vectors."""
    form = form_for(view)
    if form == "mean":
        yield
        return
    import trawmem_gpu.store.view as V
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest.config import BuildConfig

    orig, enc = V.burst_view, get_encoder(BuildConfig().encoder)

    def patched(bank):
        return revectored(orig(bank), bank, form, enc)

    V.burst_view = patched
    try:
        yield
    finally:
        V.burst_view = orig


def revectored(view, bank, form: str, enc):
    """``view`` (the burst view of ``bank``) with its units' vectors in ``form``."""
    from trawmem_gpu.data.bursts import burst_vectors
    from trawmem_gpu.data.chat_views import sentences
    from trawmem_gpu.store.bursts import unit_members

    turns = view.turns
    if form == "encoded":
        rows = [i for i, t in enumerate(turns) if len(unit_members(t)) > 1] if view is not bank else []
        new = enc.encode([turns[i].embed_text() for i in rows]) if rows else None
    elif form == "sentence-mean":
        parts = {i: sentences(t.text) for i, t in enumerate(turns) if t.text.strip()}
        rows = [i for i, p in parts.items() if len(p) > 1]
        texts, off = [], [0]
        for i in rows:
            t, ps = turns[i], parts[i]
            texts += [replace(t, text=p, caption=t.caption if j == len(ps) - 1 else None).embed_text()
                      for j, p in enumerate(ps)]
            off.append(len(texts))
        new = burst_vectors(enc.encode(texts), off) if rows else None
    else:
        raise ValueError(f"unknown unit-vector form {form!r}")
    if not rows:
        return view
    vecs = np.array(view.unit_vecs, dtype=np.float32, copy=True)
    v = np.asarray(new, dtype=np.float64)
    vecs[rows] = (v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    return replace(view, unit_vecs=vecs)
