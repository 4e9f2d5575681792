"""A bank with facts and profiles as units beside its turns."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from trawmem_gpu.store.facts import Fact, ProfileLine, ProfileSection

from engine_banks import make_bank


def _unitvecs(rng, n, d):
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def layered_bank(bank_id="b0", lens=(4, 3, 5), seed=0, n_facts=6, profiles=True):
    """A random bank (``engine_banks.make_bank``) with facts citing its turns and profile sections."""
    b = make_bank(bank_id, list(lens), seed)
    rng = np.random.default_rng(seed + 100)
    ids = [t.turn_id for t in b.turns]
    facts = []
    for k in range(n_facts):
        src = tuple(sorted(set(rng.choice(ids, size=int(rng.integers(1, 3)), replace=False)), key=ids.index))
        facts.append(Fact(f"F:{k}", f"fact number {k} about {src[0]}", src, persons=("Ana",), session=None))
    d = b.unit_vecs.shape[1]
    secs = (ProfileSection("Ana", "career", (ProfileLine("works at a port", ("F:0", "F:1")),)),
            ProfileSection("Ana", "interests", (ProfileLine("likes cats", ("F:2",)), ProfileLine("sails", ()))))
    return replace(b, facts=tuple(facts), fact_vecs=_unitvecs(rng, len(facts), d),
                   profiles=secs if profiles else (), profile_vecs=_unitvecs(rng, 2, d) if profiles else None)
