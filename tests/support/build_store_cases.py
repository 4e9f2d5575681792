"""Shared by the build-and-store tests (tests/ingest/test_build_store_*.py): the synthetic
conversation (six topics over four sessions) and the bank invariants every build must keep."""
from __future__ import annotations

from datetime import datetime

import numpy as np

from trawmem_gpu.store.graph import ADJACENT, SEMANTIC
from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.data.types import Conversation, Turn

TOPICS = {
    "cooking": ["I tried a new lasagna recipe with fresh basil and ricotta last night.",
                "Did you make the pasta sheets yourself or buy them?",
                "I rolled the dough by hand, it took forever but tasted amazing.",
                "Next time add some nutmeg to the bechamel sauce, trust me.",
                "Good idea, my grandmother always used nutmeg in her sauces.",
                "Save me a slice of that lasagna please!"],
    "hiking": ["We finally hiked the ridge trail up to the summit on Saturday.",
               "How long did the climb to the mountain top take you?",
               "About five hours, my new boots gave me blisters on the descent.",
               "You should break in hiking boots on short walks first.",
               "The view over the valley from the peak was worth every blister.",
               "Let's plan a camping trip on that trail in the autumn."],
    "job": ["My manager offered me a promotion to team lead at the office.",
            "Congratulations! Will you get a raise with the new position?",
            "Yes, a salary increase, but I will manage eight engineers now.",
            "Leading a team is a big change from writing code all day.",
            "I start the new role after the quarterly performance reviews."],
    "pets": ["We adopted a rescue puppy from the animal shelter this week.",
             "What breed is the dog and what did you name him?",
             "He is a beagle mix, we call him Biscuit, he chews every shoe.",
             "Take him to the vet for his vaccinations and a checkup.",
             "The vet said Biscuit is healthy but needs a lot of walks on a leash.",
             "Puppies need training classes too, our dog loved obedience school."],
    "music": ["I started taking guitar lessons and learned my first chords.",
              "Which songs are you practicing on the guitar?",
              "Mostly folk songs, my fingers hurt from pressing the strings.",
              "We should go to the jazz concert downtown, the band is great.",
              "I would love to see a live band play, get us two tickets.",
              "My guitar teacher plays saxophone in that jazz band."],
    "travel": ["I booked a flight to Lisbon for the spring holidays.",
               "Do you have a hotel near the old town yet?",
               "Yes, a small hotel by the river, and I renewed my passport.",
               "Try the custard tarts in Belem and ride the yellow tram.",
               "I also want a day trip to the palaces in Sintra by train.",
               "Send me postcards from Portugal!"],
}

SESSIONS = [  # (date, [(topic, n turns)])
    (datetime(2024, 1, 5, 18, 0), [("cooking", 6), ("hiking", 6), ("job", 5)]),
    (datetime(2024, 1, 12, 9, 30), [("pets", 6), ("music", 6)]),
    (datetime(2024, 1, 20, 20, 15), [("travel", 6), ("cooking", 4), ("job", 4)]),
    (datetime(2024, 2, 1, 12, 0), [("music", 2)]),
]


def synthetic_conversation(bank_id: str = "syn") -> Conversation:
    """Four sessions (17, 12, 14, 2 turns), several topics per session, one image turn."""
    turns = []
    for s, (date, parts) in enumerate(SESSIONS, 1):
        k = 0
        for topic, n in parts:
            for text in TOPICS[topic][:n]:
                k += 1
                cap = "a photo of a beagle puppy on a rug" if (s == 2 and k == 3) else None
                turns.append(Turn(f"D{s}:{k}", "Ana" if k % 2 else "Ben", text, s, date.isoformat(), date, cap))
    return Conversation(bank_id, turns, ("Ana", "Ben"))


N_SYN = sum(n for _, parts in SESSIONS for _, n in parts)
SESSION_STARTS = np.cumsum([0] + [sum(n for _, n in parts) for _, parts in SESSIONS]).tolist()  # [0,17,29,43,45]


# ----------------------------------------------------------------------------------------------


def check_bank_invariants(bank, cfg: BuildConfig):
    N, J = bank.n_units, bank.n_threads
    off = bank.thread_offsets
    lens = np.diff(off)
    assert off[0] == 0 and off[-1] == N
    assert np.all(lens > 0), "empty thread"
    # every unit in exactly one thread
    ut = bank.unit_thread
    assert len(ut) == N and np.array_equal(np.bincount(ut, minlength=J), lens)
    # no thread crosses a session; threads start at every session start
    sess = np.array([t.session for t in bank.turns])
    for j in range(J):
        assert len(set(sess[off[j]:off[j + 1]])) == 1, f"thread {j} crosses a session"
    session_starts = {0} | {i for i in range(1, N) if sess[i] != sess[i - 1]}
    assert session_starts <= set(off[:-1].tolist())
    if cfg.segmentation == "embedding":
        assert lens.max() <= cfg.max_thread_len
        sess_len = {s: int((sess == s).sum()) for s in set(sess.tolist())}
        for j in range(J):
            assert lens[j] >= cfg.min_thread_len or lens[j] == sess_len[sess[off[j]]]
    # vectors finite and unit-norm
    for v, n in ((bank.unit_vecs, N), (bank.head_vecs, J)):
        assert v.shape[0] == n and v.dtype == np.float32
        assert np.all(np.isfinite(v))
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert len(bank.heads) == J and all(h.strip() for h in bank.heads)
    assert set(bank.head_kind) == {"extractive"}
    # edges: symmetric, sorted, no self loops or duplicates, weights in [0, 1]
    src, dst, w, kind = bank.edge_src, bank.edge_dst, bank.edge_w, bank.edge_kind
    assert len(src) == len(dst) == len(w) == len(kind)
    assert np.all(src != dst)
    assert np.all((w >= 0) & (w <= 1))
    order = np.lexsort((dst, src))
    assert np.array_equal(order, np.arange(len(src))), "edges not sorted by (src, dst)"
    pairs = list(zip(src.tolist(), dst.tolist()))
    assert len(set(pairs)) == len(pairs)
    fwd = {(a, b): (float(x), int(k)) for a, b, x, k in zip(src.tolist(), dst.tolist(), w, kind)}
    for (a, b), v in fwd.items():
        assert fwd.get((b, a)) == v, f"edge {a}->{b} has no mirror"
    # adjacency edges are exactly the consecutive thread pairs, weight 1
    adj = {(a, b) for (a, b), (x, k) in fwd.items() if k == ADJACENT}
    assert adj == {(j, j + 1) for j in range(J - 1)} | {(j + 1, j) for j in range(J - 1)}
    assert all(x == 1.0 for (x, k) in fwd.values() if k == ADJACENT)
    # semantic edges: weight = cosine of the heads, at least the threshold
    sem = [(a, b, x) for (a, b), (x, k) in fwd.items() if k == SEMANTIC]
    assert set(kind.tolist()) <= {ADJACENT, SEMANTIC}
    for a, b, x in sem:
        assert abs(b - a) > 1
        c = float(bank.head_vecs[a] @ bank.head_vecs[b])
        assert abs(x - min(max(c, 0.0), 1.0)) < 1e-4
        assert c >= cfg.knn_threshold - 1e-5
    bank.validate()


def split_turns(conv, k):
    return Conversation(conv.bank_id, list(conv.turns[:k]), conv.speakers), list(conv.turns[k:])
