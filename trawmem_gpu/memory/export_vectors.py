"""Vectors in an export (``trawmem export --vectors``, ``docs/export.md``): each turn's, fact's and
thread head's vector as base64 of little-endian float32 (what a bank stores), next to the SHA-256 of
the text it encodes; the header names the encoder (``vectors``: ``model``, ``dim``, ``dtype``).

On import into a collection of the same encoder, :class:`GivenVectors` answers the bank's encode
calls from those vectors: a text whose digest the file carries is not encoded again, any other text
(a head the import's segmentation made differently) goes to the collection's encoder. Into a
collection of another encoder the import stops at the header (:func:`check_header`).
"""
from __future__ import annotations

import base64
import binascii
import hashlib

import numpy as np

from ..encode.base import Encoder
from ..errors import InputError

DTYPE = "float32"
"""The one dtype of exported vectors: banks store float32 (``store.bank.Bank.unit_vecs``)."""


def text_key(text: str) -> str:
    """The digest a vector is filed under: SHA-256 (hex) of the text the encoder read."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def vec_text(v: np.ndarray) -> str:
    """One vector as base64 of little-endian float32."""
    return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")


def header(encoder) -> dict:
    """The header's ``vectors`` field for vectors of ``encoder``."""
    return {"model": encoder.id, "dim": int(encoder.dim), "dtype": DTYPE}


def check_header(n: int, spec, encoder) -> None:
    """The header's ``vectors`` (line ``n``) against the importing collection's ``encoder``: an
    ``InputError`` naming the field unless the model, dimension and dtype are the same."""
    if not isinstance(spec, dict):
        raise InputError(f"line {n}: field 'vectors': expected an object (model, dim, dtype)")
    if spec.get("dtype") != DTYPE:
        raise InputError(f"line {n}: field 'vectors.dtype': expected {DTYPE!r}, got {str(spec.get('dtype'))[:32]!r}")
    if spec.get("model") != encoder.id:
        raise InputError(f"line {n}: field 'vectors.model': the file's vectors are of {str(spec.get('model'))[:96]!r}, "
                         f"this collection encodes with {encoder.id!r} (export it again without its vectors)")
    if spec.get("dim") != encoder.dim:
        raise InputError(f"line {n}: field 'vectors.dim': the file's vectors have {str(spec.get('dim'))[:16]} "
                         f"dimensions, this collection's encoder {encoder.dim}")


def read_vec(n: int, rec: dict, field: str, dim: int, into: dict) -> None:
    """File line ``n``'s ``field`` (a vector) and ``field``'s digest (``<field>_of``) in ``into``; an
    ``InputError`` naming the field when either is malformed. A line without the field adds nothing."""
    s = rec.get(field)
    if s is None:
        return
    key = rec.get(f"{field}_of")
    if not isinstance(key, str) or len(key) != 64:
        raise InputError(f"line {n}: field '{field}_of': expected the SHA-256 (hex) of the encoded text")
    try:
        raw = base64.b64decode(s, validate=True) if isinstance(s, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 4 * dim:
        raise InputError(f"line {n}: field {field!r}: expected base64 of {dim} float32 values")
    v = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(v)):
        raise InputError(f"line {n}: field {field!r}: holds a value that is not finite")
    into[key] = v


class GivenVectors(Encoder):
    """``inner`` (the collection's encoder), with the vectors ``given`` (digest -> vector) used for
    the texts they encode; ``encoded`` counts the texts ``inner`` encoded."""

    def __init__(self, inner: Encoder, given: dict):
        self.inner, self.given, self.id, self.dim = inner, given, inner.id, inner.dim
        self.encoded = 0

    def _encode_batch(self, texts, is_query):  # pragma: no cover - encode() is overridden
        return self.inner._encode_batch(texts, is_query)

    def encode(self, texts, *, is_query: bool = False, **kw):
        texts = list(texts)
        if is_query or not self.given:
            self.encoded += len(texts)
            return self.inner.encode(texts, is_query=is_query, **kw)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        todo = []
        for i, t in enumerate(texts):
            v = self.given.get(text_key(t))
            if v is None:
                todo.append(i)
            else:
                out[i] = v
        if todo:
            self.encoded += len(todo)
            out[todo] = self.inner.encode([texts[i] for i in todo], **kw)
        return out
