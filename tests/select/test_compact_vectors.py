"""Compact vectors (issue 46 item 2): a collection's ``vectors`` choice (``store/vectors.py``) sets the
codes of a large bank's approximate index (``select/steps/ann.py``: faiss ``IndexHNSWSQ`` /
``IndexIVFScalarQuantizer``), every proposal re-scored exactly; appends grow the index without a
rebuild and a forget leaves no vector of its turn in any index the engine holds.

The agreement bounds are derived from the measurement on these banks (``|A & E| / |E|`` per query,
against the float32 collection's candidate pool and picks): float16 and int8 both measured 1.0 on
the pool and the picks at ``ann_shortlist`` 16; the bound leaves 1% for a near-tie moved by a
quantized distance. The float32 default stays as it was: same index type, same picks.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select.config import EngineConfig, SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.steps import ann
from trawmem_gpu.select.steps.ann import AnnParams, VectorIndex

from benchmarks.synthetic_banks import make_banks, make_queries

AGREEMENT = 0.99
"""Least mean per-query agreement of a compact collection's candidate pool and picks with the float32
collection's (measured: 1.0 for both choices, see the module docstring)."""
PARAMS = AnnParams(nprobe=64, ef_search=64)


def _agreement(got, want) -> list[float]:
    return [len(np.intersect1d(np.asarray(a), np.asarray(e))) / max(len(e), 1) for a, e in zip(got, want)]


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def clustered():
    bank = make_banks(1, units=3000, thread_len=6.0, d=32, seed=11, prefix="big")[0]
    return [bank], make_queries([bank], 24, seed=12)


@pytest.fixture(scope="module")
def float32_run(clustered):
    banks, (ids, qs, Z) = clustered
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1000, ann_shortlist=16)
    return eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z)


@pytest.mark.parametrize("vectors", ["float16", "int8"])
def test_a_compact_collection_picks_what_the_float32_one_picks(clustered, float32_run, vectors):
    banks, (ids, qs, Z) = clustered
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1000, ann_shortlist=16, vectors=vectors)
    pool, picks = eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z)
    index = eng.snapshot.infos[0].cache[("unit_index", "auto", vectors)][0]
    assert type(index.index).__name__ == "IndexHNSWSQ" and index.vectors == vectors
    assert np.mean(_agreement(pool, float32_run[0])) >= AGREEMENT
    assert np.mean(_agreement(picks, float32_run[1])) >= AGREEMENT
    assert all(set(p) <= set(c.tolist()) for p, c in zip(picks, pool))


def test_the_float32_default_is_unchanged(clustered, float32_run):
    banks, (ids, qs, Z) = clustered
    assert EngineConfig().vectors == "float32"
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1000, ann_shortlist=16, vectors="float32")
    pool = eng.candidate_sets(ids, qs, Z)
    for a, b in zip(pool, float32_run[0]):
        np.testing.assert_array_equal(a, b)
    assert eng.select_units(ids, qs, Z) == float32_run[1]
    index = eng.snapshot.infos[0].cache[("unit_index", "auto")][0]
    assert type(index.index).__name__ == "IndexHNSWFlat" and index.labels is None


def test_an_unknown_vectors_choice_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="vectors must be one of float32, float16, int8, pq"):
        EngineConfig(vectors="int4")


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
@pytest.mark.parametrize("vectors", ["float16", "int8"])
def test_compact_codes_take_less_memory_and_find_the_same_neighbours(kind, vectors, monkeypatch):
    rng = np.random.default_rng(0)
    x, q = _unit(rng.standard_normal((4000, 32))), _unit(rng.standard_normal((20, 32)))
    exact = np.argsort(-(q @ x.T), axis=1)[:, :20]
    monkeypatch.setattr(ann, "IVF_FLOAT32_CODES", "float32")  # the float32 copy they are measured against
    flat, compact = VectorIndex(x, kind), VectorIndex(x, kind, vectors=vectors)
    assert type(flat.index).__name__ == {"hnsw": "IndexHNSWFlat", "ivf": "IndexIVFFlat"}[kind]
    assert type(compact.index).__name__ == {"hnsw": "IndexHNSWSQ", "ivf": "IndexIVFScalarQuantizer"}[kind]
    assert compact.nbytes() < flat.nbytes()
    recall = [np.mean(_agreement(ix.search(q, 20, PARAMS)[1], exact)) for ix in (flat, compact)]
    assert recall[1] >= recall[0] - 0.02, recall


def test_pq_subvectors_divide_the_width():
    from trawmem_gpu.store.vectors import pq_subvectors

    assert [pq_subvectors(d) for d in (384, 64, 32, 30, 7, 1)] == [48, 8, 4, 3, 1, 1]
    assert all(d % pq_subvectors(d) == 0 for d in range(1, 400))


def _clustered_unit(n: int, d: int, seed: int, noise: float = 0.1):
    rng = np.random.default_rng(seed)
    centres = _unit(rng.standard_normal((40, d)))
    return _unit(centres[rng.integers(0, 40, n)] + noise * rng.standard_normal((n, d)).astype(np.float32))


@pytest.fixture(scope="module")
def pq_pair():
    """An IVF index of ``pq`` codes over 10,001 clustered vectors (just past ``PQ_MIN_VECTORS``) and
    the ``int8`` one over the same vectors."""
    x = _clustered_unit(10_001, 32, 4)
    return x, VectorIndex(x, "ivf", vectors="pq"), VectorIndex(x, "ivf", vectors="int8")


def test_pq_codes_take_an_eighth_of_int8_and_find_the_same_neighbours(pq_pair):
    """``pq``: faiss ``IndexIVFPQ``, ``d / 8`` bytes a vector; after the float32 re-rank of four times
    the proposals its top 50 keeps at least 0.9 of exact search's (measured on these vectors, every
    list probed: 0.924, where ``int8`` keeps 1.0; 0.78 at a re-rank of 2x, 0.985 at 8x: at d = 32 a
    sub-vector of 8 dimensions in one byte is coarse), and the scores it returns are exact."""
    x, pq, sq = pq_pair
    assert type(pq.index).__name__ == "IndexIVFPQ" and pq.codes == "pq" and pq.code_size == 4
    assert pq.index.code_size == 4 and sq.code_size == 32
    assert pq.nbytes() < sq.nbytes() - 0.8 * 28 * len(x)
    q = _clustered_unit(30, 32, 5)
    exact = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :50]
    params = AnnParams(nprobe=pq.nlist, ef_search=64)  # every list: the codes are what differs
    D, I = pq.search(q, 50, params)
    recall = [np.mean(_agreement(ix.search(q, 50, params)[1], exact)) for ix in (pq, sq)]
    assert recall[0] >= 0.9 and recall[1] >= 0.99, recall
    np.testing.assert_allclose(D, np.einsum("qkd,qd->qk", x[I], q), rtol=1e-5, atol=1e-6)  # re-ranked in float32


@pytest.mark.parametrize("kind,n", [("hnsw", 3000), ("ivf", 9983)])
def test_pq_falls_back_to_int8_codes_below_its_training_size_or_on_hnsw(kind, n):
    from trawmem_gpu.store.vectors import PQ_MIN_VECTORS

    assert n < PQ_MIN_VECTORS or kind == "hnsw"
    x = _clustered_unit(n, 16, 6)
    ix = VectorIndex(x, kind, vectors="pq")
    assert ix.codes == "int8" and ix.vectors == "pq" and ix.code_size == 16
    assert type(ix.index).__name__ == {"hnsw": "IndexHNSWSQ", "ivf": "IndexIVFScalarQuantizer"}[kind]
    _, I = ix.search(x[:5], 1, PARAMS)
    np.testing.assert_array_equal(I[:, 0], np.arange(5))


def test_a_grown_pq_index_files_the_appended_vectors(pq_pair):
    x, pq, _ = pq_pair
    y = _clustered_unit(37, 32, 7)
    new = pq.grown(y, len(x), np.concatenate([x, y]))
    assert new.index is pq.index and new.codes == "pq" and new.n == len(x) + 37
    _, I = new.search(y, 1, AnnParams(nprobe=64, ef_search=64))
    np.testing.assert_array_equal(I[:, 0], np.arange(len(x), len(x) + 37))
    _, I = pq.search(y, 3, AnnParams(nprobe=64, ef_search=64))
    assert I.max() < len(x)  # the old object never proposes the appended vectors


def test_a_pq_collection_picks_what_the_float32_one_picks():
    """Engine level, on an IVF index of ``pq`` codes (a bank past ``PQ_MIN_VECTORS``): the candidate
    pool and picks agree with the float32 collection's on at least :data:`AGREEMENT` of units."""
    bank = make_banks(1, units=10_200, thread_len=6.0, d=32, seed=13, prefix="pq")[0]
    ids, qs, Z = make_queries([bank], 16, seed=14)
    opts = dict(device="cpu", ann_min_units=1000, ann_shortlist=16, ann_index="ivf")
    ref = SelectionEngine([bank], SelectConfig(), **opts)
    eng = SelectionEngine([bank], SelectConfig(), vectors="pq", **opts)
    pool, picks = eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z)
    assert eng.snapshot.infos[0].cache[("unit_index", "ivf", "pq")][0].codes == "pq"
    assert np.mean(_agreement(pool, ref.candidate_sets(ids, qs, Z))) >= AGREEMENT
    assert np.mean(_agreement(picks, ref.select_units(ids, qs, Z))) >= AGREEMENT


@pytest.mark.parametrize("vectors", ["float32", "int8"])
def test_a_grown_index_answers_for_the_appended_bank_and_the_old_one_for_the_old(vectors):
    """``grown``: ids before ``start`` kept, those from it replaced by the new vectors; the object it
    grew from still answers for the old bank (an older snapshot's queries)."""
    rng = np.random.default_rng(1)
    x, y = _unit(rng.standard_normal((300, 32))), _unit(rng.standard_normal((40, 32)))
    old = VectorIndex(x, "hnsw", vectors=vectors)
    new = old.grown(y, 290, np.concatenate([x[:290], y]))  # units 290.. replaced, 40 new ones: 330 units
    assert new.n == 330 and old.n == 300 and new.index is old.index
    _, I = new.search(y, 1, PARAMS)
    np.testing.assert_array_equal(I[:, 0], np.arange(290, 330))
    _, I = new.search(x[290:], 5, PARAMS)
    assert not np.isin(I, np.arange(290, 300)).any() or (I[:, 0] != np.arange(290, 300)).all()
    _, I = old.search(np.concatenate([x[290:], y]), 5, PARAMS)
    assert I.max() < 300 and (I[:10, 0] == np.arange(290, 300)).all()
    _, I = new.search(x[:50], 1, PARAMS, keep=np.arange(330) % 2 == 0)  # a filter over the new ids
    assert (I[:, 0] % 2 == 0).all() and ((I[:, 0] == np.arange(50)) == (np.arange(50) % 2 == 0)).all()
    new.remove([0, 2, 4])
    _, I = new.search(x[:6], 3, PARAMS)
    assert not np.isin(I, [0, 2, 4]).any()


def _labels_plain(n_total: int, owned: list[tuple[int, int]]) -> np.ndarray:
    """What an object's labels are, stated plainly: ``-1`` everywhere but its own runs of faiss
    positions ``(position, id)``."""
    out = np.full(n_total, -1, dtype=np.int64)
    for pos, uid in owned:
        out[pos] = uid
    return out


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_a_line_of_appends_writes_only_past_its_end_and_a_branch_copies(kind):
    """Appends at the end share one label buffer (each append writes its own labels; doubling),
    yet every older object keeps its own labels and answers for its own bank; growing an older
    object again (a branch), or replacing ids, copies instead of writing over a newer object's."""
    rng = np.random.default_rng(3)
    d = 16
    x = _unit(rng.standard_normal((260, d)))
    base = VectorIndex(x[:100], kind)
    line = [base]
    for a, b in [(100, 103), (103, 150), (150, 151), (151, 200)]:  # odd sizes; one of a single vector
        line.append(line[-1].grown(x[a:b], a))
    assert all(o._tail is line[1]._tail for o in line[2:])  # the first append's buffer (room for 200) served the line
    branch = line[2].grown(x[200:230], 150)  # an older object grown again: positions 200.. of the faiss index
    again = line[-1].grown(x[230:260], 200)  # the line goes on: positions 230..
    for obj, n in zip(line, [100, 103, 150, 151, 200]):
        assert obj.n == n
        if obj.labels is not None:
            np.testing.assert_array_equal(obj.labels, np.arange(n))
        _, I = obj.search(x[:n], 1, PARAMS)
        assert I.max() < n
    np.testing.assert_array_equal(branch.labels, _labels_plain(230, [(i, i) for i in range(150)]
                                                               + [(200 + j, 150 + j) for j in range(30)]))
    np.testing.assert_array_equal(again.labels, _labels_plain(260, [(i, i) for i in range(200)]
                                                              + [(230 + j, 200 + j) for j in range(30)]))
    _, I = branch.search(x[200:230], 1, PARAMS)
    np.testing.assert_array_equal(I[:, 0], np.arange(150, 180))
    _, I = again.search(x[230:260], 1, PARAMS)
    np.testing.assert_array_equal(I[:, 0], np.arange(200, 230))
    replaced = again.grown(x[:5], 198)  # ids 198.. replaced: a copy with 198 and 199 masked out
    assert replaced._tail is not again._tail
    assert (replaced.labels[198:200] == -1).all() and (again.labels[198:200] == [198, 199]).all()


def _conversation(n: int, marker: str | None = None):
    from datetime import datetime, timedelta

    from trawmem_gpu.data.types import Conversation, Turn

    rng = np.random.default_rng(5)
    words = "dog cat hike lake paris school paint music trip sister book garden piano beach yoga race".split()
    t, out = datetime(2024, 1, 1, 9), []
    for i in range(n):
        t += timedelta(minutes=15) if i % 9 else timedelta(days=1)
        text = f"the code is {marker} zz{marker}" if marker and i == n // 2 else " ".join(rng.choice(words, 6))
        out.append(Turn(f"m{i}", "Ann" if i % 2 else "Bob", text, 1 + i // 9, t.strftime("%d %B %Y"), t))
    return Conversation("c", out)


def test_an_append_grows_the_index_instead_of_rebuilding_it():
    from word_encoder import WordEncoder

    from trawmem_gpu.ingest import build_banks, update_bank

    enc = WordEncoder()
    turns = _conversation(160).turns
    (bank,), _ = build_banks([type(_conversation(1))("c", turns[:120])], encoder=enc, progress=False)
    qs = ["When did they hike to the lake?", "Which book did her sister paint?"]
    Z = enc.encode(qs)
    eng = SelectionEngine([bank], SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=1000, vectors="int8")
    eng.select_units(["c"] * 2, qs, Z)
    key = ("unit_index", "auto", "int8")
    first = eng.snapshot.infos[0].cache[key][0]
    bigger, _ = update_bank(bank, list(turns[120:]), encoder=enc)
    eng.replace_bank(bigger)
    assert ("grown", *key) in eng.snapshot.infos[0].cache
    got = eng.select_units(["c"] * 2, qs, Z)
    index = eng.snapshot.infos[0].cache[key][0]
    assert index.index is first.index and index.labels is not None and index.n == bigger.n_units  # not rebuilt
    exact = SelectionEngine([bigger], SelectConfig(), device="cpu", ann_min_units=None)
    assert got == exact.select_units(["c"] * 2, qs, Z)  # a shortlist of the whole bank: the exact picks


def test_a_forgotten_turn_leaves_no_vector_in_any_index_the_engine_holds():
    """The index is held in memory only (no index file: the no-trace tests of the collection's files
    cover every file); a forget rewrites the bank, so its index is built anew from the bank without
    the turn, and the old one goes with the purged tables."""
    from word_encoder import WordEncoder

    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.forget import without_turns

    enc = WordEncoder()
    marker = "qxzv51"
    (bank,), _ = build_banks([_conversation(120, marker)], encoder=enc, progress=False)
    gone = next(i for i, t in enumerate(bank.turns) if marker in t.text)
    v = np.asarray(bank.unit_vecs[gone], np.float32)
    qs, Z = ["what is the code"], enc.encode(["what is the code " + marker])
    eng = SelectionEngine([bank], SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=64, vectors="int8")

    def nearest() -> float:
        best = -1.0
        for info in eng.snapshot.infos:
            for key, got in info.cache.items():
                if key[0] in ("unit_index", "grown"):
                    index = got[0] if key[0] == "unit_index" else got
                    stored = index.index.reconstruct_n(0, index.index.ntotal)
                    best = max(best, float((stored @ v).max()))
        return best

    eng.select_units(["c"], qs, Z)
    assert nearest() > 0.99  # the quantized vector is there before the forget: the check can fail
    smaller, _ = without_turns(bank, [bank.turns[gone].turn_id], enc)
    eng.replace_bank(smaller)
    eng.purge()
    eng.select_units(["c"], qs, Z)
    assert nearest() < 0.99


def test_a_float32_ivf_index_holds_float16_codes_and_proposes_as_the_flat_one(monkeypatch):
    """A float32 collection's IVF index holds float16 codes (``ann.IVF_FLOAT32_CODES``: half the
    bytes a search reads) under float16 centroids (``ann.IVF_QUANTIZER16``), not re-ranked; on
    clustered vectors its proposals are those of float32 centroids and of the flat copy (the caller
    re-scores them exactly, so the same set is the same shortlist), and it still grows."""
    x = _clustered_unit(8_000, 32, 5)
    q = _clustered_unit(30, 32, 6)
    half = VectorIndex(x, "ivf")
    assert half.codes == "float16" and half.rerank is None and half.code_size == 2 * 32
    assert type(half.index).__name__ == "IndexIVFScalarQuantizer"
    import faiss
    assert half.quantizer16 and type(faiss.downcast_index(half.index.quantizer)).__name__ == "IndexScalarQuantizer"
    monkeypatch.setattr(ann, "IVF_QUANTIZER16", False)
    flat_centroids = VectorIndex(x, "ivf")
    assert not flat_centroids.quantizer16 and type(faiss.downcast_index(flat_centroids.index.quantizer)).__name__ == "IndexFlatIP"
    assert half.nbytes() < flat_centroids.nbytes()
    got, want = half.search(q, 100, PARAMS)[1], flat_centroids.search(q, 100, PARAMS)[1]
    assert np.mean([len(np.intersect1d(a, b)) / len(b) for a, b in zip(got, want)]) >= 0.99
    monkeypatch.setattr(ann, "IVF_FLOAT32_CODES", "float32")
    flat = VectorIndex(x, "ivf")
    assert flat.codes == "float32" and type(flat.index).__name__ == "IndexIVFFlat"
    assert half.nbytes() < flat.nbytes()
    got, want = half.search(q, 100, PARAMS)[1], flat.search(q, 100, PARAMS)[1]
    same = [len(np.intersect1d(a, b)) / len(b) for a, b in zip(got, want)]
    assert np.mean(same) >= 0.99, same
    more = _clustered_unit(50, 32, 7)
    grown = half.grown(more, len(x))
    _, ids = grown.search(more[:5], 1, PARAMS)
    assert ids[:, 0].tolist() == list(range(len(x), len(x) + 5))
