"""``steps/ann.py:file_lists``: an IVF index whose lists are written at once holds the same ids and
codes, list by list in the same order, as faiss's ``add`` builds (flat, float16 and int8 scalar
codes, product codes; empty lists; chunks smaller than a list), so it answers every search the
same; a non-empty index is refused."""
from __future__ import annotations

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from trawmem_gpu.select.steps import ann  # noqa: E402


def _lists(index) -> list[tuple[np.ndarray, np.ndarray]]:
    inv = index.invlists
    out = []
    for lst in range(index.nlist):
        m = inv.list_size(lst)
        ids = faiss.rev_swig_ptr(inv.get_ids(lst), m).copy() if m else np.zeros(0, np.int64)
        codes = faiss.rev_swig_ptr(inv.get_codes(lst), m * index.code_size).copy() if m else np.zeros(0, np.uint8)
        out.append((ids, codes))
    return out


def _pair(kind: str, x: np.ndarray, nlist: int):
    d = x.shape[1]
    made = []
    for _ in range(2):
        q = faiss.IndexFlatIP(d)
        if kind == "flat":
            ix = faiss.IndexIVFFlat(q, d, nlist, faiss.METRIC_INNER_PRODUCT)
        elif kind == "pq":
            ix = faiss.IndexIVFPQ(q, d, nlist, 4, 8, faiss.METRIC_INNER_PRODUCT)
        else:
            qt = {"fp16": faiss.ScalarQuantizer.QT_fp16, "int8": faiss.ScalarQuantizer.QT_8bit}[kind]
            ix = faiss.IndexIVFScalarQuantizer(q, d, nlist, qt, faiss.METRIC_INNER_PRODUCT)
        ix.train(x)
        made.append((ix, q))
    return made


@pytest.mark.parametrize("kind", ["flat", "fp16", "int8", "pq"])
@pytest.mark.parametrize("chunk", [7, 1 << 16])
def test_filed_lists_equal_faiss_add(kind, chunk, monkeypatch):
    rng = np.random.default_rng(3)
    n, d, nlist = 3000, 16, 32
    x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    (a, qa), (b, qb) = _pair(kind, x, nlist)
    a.add(x)
    monkeypatch.setattr(ann, "FILE_CHUNK", chunk)
    ann.file_lists(b, x)
    assert b.ntotal == a.ntotal == n
    for (ia, ca), (ib, cb) in zip(_lists(a), _lists(b)):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ca, cb)
    z = x[:5] + 0.1
    for nprobe in (1, 4, nlist):
        sp = faiss.SearchParametersIVF(nprobe=nprobe)
        Da, Ia = a.search(z, 50, params=sp)
        Db, Ib = b.search(z, 50, params=sp)
        np.testing.assert_array_equal(Ia, Ib)
        np.testing.assert_array_equal(Da, Db)


def test_empty_lists_empty_input_and_a_filled_index():
    rng = np.random.default_rng(4)
    d = 8
    train = rng.standard_normal((400, d)).astype(np.float32)
    (a, qa), (b, qb) = _pair("fp16", train, 16)
    x = np.repeat(train[:1], 50, axis=0)  # every vector to one list: the others stay empty
    a.add(x)
    ann.file_lists(b, x)
    sizes = [b.invlists.list_size(lst) for lst in range(16)]
    assert sorted(sizes)[-1] == 50 and sum(sizes) == 50
    for (ia, ca), (ib, cb) in zip(_lists(a), _lists(b)):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ca, cb)
    with pytest.raises(ValueError, match="empty index"):
        ann.file_lists(b, x)
    (c, qc), _ = _pair("fp16", train, 16)
    ann.file_lists(c, np.zeros((0, d), np.float32))
    assert c.ntotal == 0


def test_the_vector_index_files_its_lists_and_grows_as_before(monkeypatch):
    """A ``VectorIndex`` built with filed lists and one built with faiss's add propose the same
    units, before and after an append (which adds through faiss, as before)."""
    rng = np.random.default_rng(5)
    n, d = 5000, 24
    x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    filed = ann.VectorIndex(x, "ivf")
    monkeypatch.setattr(ann, "FILED_LISTS", False)
    added = ann.VectorIndex(x, "ivf")
    for (ia, ca), (ib, cb) in zip(_lists(added.index), _lists(filed.index)):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ca, cb)
    p = ann.AnnParams(8, 64)
    z = x[:7]
    more = rng.standard_normal((30, d)).astype(np.float32)
    for ix in (filed, added):
        ix.g = ix.grown(more, n)
    for a, b in ((filed, added), (filed.g, added.g)):
        Da, Ia = a.search(z, 40, p)
        Db, Ib = b.search(z, 40, p)
        np.testing.assert_array_equal(Ia, Ib)
        np.testing.assert_array_equal(Da, Db)
