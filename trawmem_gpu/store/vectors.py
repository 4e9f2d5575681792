"""A collection's vector storage choice, ``vectors``: ``float32`` | ``float16`` | ``int8`` | ``pq``, defined here once.

The choice is made when a collection is created (``Collection(dir, create=True, vectors=...)``),
recorded in its index (``collection.json``'s ``"vectors"``) and fixed for the collection's life: a
later open that asks for another is a ``ConfigError`` naming the field; an index without the field
(every collection written before it existed) is ``float32``.

What each choice changes: the banks' files keep their float32 vectors either way
(``tensors.safetensors``, memory-mapped, read for the exact re-rank of a shortlist); the choice
sets the codes the engine's approximate index over a large bank holds resident
(``select/steps/ann.py``: faiss ``IndexHNSWSQ`` / ``IndexIVFScalarQuantizer``):

``float32``
    ``IndexHNSWFlat`` (a float32 copy of every vector), as before the choice; an IVF index (2^16
    vectors and more) holds float16 codes, not re-ranked (``steps.ann.IVF_FLOAT32_CODES``: its
    lists' scan is bound by memory bandwidth, and every proposal is re-scored exactly anyway).
``float16``
    faiss ``ScalarQuantizer.QT_fp16``: 2 bytes a dimension.
``int8``
    faiss ``ScalarQuantizer.QT_8bit``: 1 byte a dimension, each dimension's min/max trained on the
    vectors the index is built from (faiss's ``RS_minmax``); appended vectors outside that range are
    clipped to it. faiss rather than a hand-written per-dimension quantizer: its SIMD distance
    computers search the codes without dequantizing them, and HNSW / IVF take the codes as they are.
``pq``
    faiss product quantization (``IndexIVFPQ``): ``d / 8`` sub-vectors of 8 dimensions, one byte
    (256 trained centroids) each, so 48 bytes a vector at d = 384 against ``int8``'s 384, for an
    IVF index (:func:`pq_subvectors`); an HNSW index (a bank of fewer than 2^16 units,
    ``steps.ann.IVF_MIN_VECTORS``) and an IVF index of fewer than :data:`PQ_MIN_VECTORS` vectors
    hold ``int8`` codes instead (too few vectors to train 256 centroids per sub-vector). Its coarser
    distances are made up by re-ranking four times the proposals in float32 (``steps.ann``).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BankError, ConfigError

VECTOR_KINDS = ("float32", "float16", "int8", "pq")
"""The storage choices, the default first."""
DEFAULT_VECTORS = VECTOR_KINDS[0]
BYTES_PER_DIM = {"float32": 4, "float16": 2, "int8": 1}
"""Bytes per dimension of one vector's scalar code (``pq``: :func:`pq_subvectors` bytes a vector)."""
PQ_DIMS = 8
"""Dimensions per product-quantizer sub-vector (``pq``): one byte of code each."""
PQ_MIN_VECTORS = 256 * 39
"""Fewest vectors a ``pq`` index is product quantized from (faiss's least training set for 256
centroids without a warning); fewer: ``int8`` codes."""


def pq_subvectors(d: int) -> int:
    """Sub-vectors (bytes of code) of a ``pq`` vector of width ``d``: the largest divisor of ``d``
    not above ``d / PQ_DIMS`` (at least 1): 48 at d = 384, 8 at 64."""
    m = max(1, d // PQ_DIMS)
    while d % m:
        m -= 1
    return m


def check_vectors(value, field: str = "vectors") -> str:
    """``value`` when it is one of :data:`VECTOR_KINDS`, else a ``ConfigError`` naming ``field``."""
    if not isinstance(value, str) or value not in VECTOR_KINDS:
        raise ConfigError(f"{field} must be one of {', '.join(VECTOR_KINDS)} (got {value!r})")
    return value


def sq_type(faiss, kind: str):
    """The faiss ``ScalarQuantizer`` type of the compact ``kind`` (``float16`` / ``int8``; ``pq``
    where it falls back to scalar codes: ``int8``)."""
    return {"float16": faiss.ScalarQuantizer.QT_fp16, "int8": faiss.ScalarQuantizer.QT_8bit,
            "pq": faiss.ScalarQuantizer.QT_8bit}[check_vectors(kind)]


def recorded_vectors(idx: dict, where, asked: str | None = None) -> str:
    """The choice a collection index ``idx`` (read from ``where``) records, ``float32`` without the
    field; a ``BankError`` for a value that is no choice, a ``ConfigError`` naming ``vectors`` when
    the open ``asked`` for another."""
    vectors = idx.get("vectors", DEFAULT_VECTORS)  # no field: written before the choice existed
    if vectors not in VECTOR_KINDS:
        raise BankError(f"{where}: corrupt collection index (field 'vectors' must be one of "
                        f"{', '.join(VECTOR_KINDS)}, got {vectors!r})")
    if asked is not None and vectors != asked:
        raise ConfigError(f"vectors: the collection {Path(where).parent} stores {vectors} vectors (fixed when it "
                          f"was created), not {asked}; open it without vectors= or with vectors={vectors!r}")
    return vectors


def record_vectors(idx: dict, vectors: str) -> dict:
    """``idx`` with the choice ``vectors`` recorded: a float32 index has no field (byte for byte the
    index written before the choice existed)."""
    return idx if vectors == DEFAULT_VECTORS else {**idx, "vectors": check_vectors(vectors)}
