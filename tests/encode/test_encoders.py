"""Encoders: the embedded MiniLM default, a local transformers model with last-token pooling
and a query instruction, the on-disk cache, and clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.encode import CachedEncoder, Encoder, EmbeddingCache, HFEncoder, get_encoder, minilm_encoder
from trawmem_gpu.errors import ConfigError

TEXTS = ["a short one", "a much longer sentence about running a half marathon in April", "x", "a short one"]


@pytest.fixture(scope="module")
def minilm():
    return minilm_encoder(device="cpu")


def test_minilm_unit_norm_order_and_batching(minilm):
    v = minilm.encode(TEXTS, batch_size=2)
    assert v.shape == (4, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # Length-sorted batching must give back input order: duplicates agree, others differ.
    np.testing.assert_allclose(v[0], v[3], atol=1e-6)
    one_by_one = np.stack([minilm.encode([t])[0] for t in TEXTS])
    np.testing.assert_allclose(v, one_by_one, atol=1e-5)
    assert minilm.encode([]).shape == (0, 384)


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory, minilm):
    """A tiny randomly initialised Qwen3 model saved to a local directory (no download): the
    architecture of Qwen3-Embedding-0.6B at toy size, with MiniLM's tokenizer files."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    d = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(minilm.tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    Qwen3Model(cfg).save_pretrained(d)
    minilm.tok.save_pretrained(d)
    return d


def test_last_token_pooling_with_query_instruction(tiny_qwen3):
    """A local decoder embedder loaded the Qwen3-Embedding way: left padding, last-token
    pooling, instruction before queries only."""
    enc = HFEncoder(tiny_qwen3, pooling="last_token", query_instruction="Instruct: find it\nQuery: ", device="cpu")
    assert enc.dim == 32
    assert enc.tok.padding_side == "left" and "last_token" in enc.id
    docs = enc.encode(TEXTS, batch_size=4)
    singles = np.stack([enc.encode([t])[0] for t in TEXTS])
    # Left padding keeps each sequence's last real token at the last position.
    np.testing.assert_allclose(docs, singles, atol=1e-4)
    q = enc.encode(["a short one"], is_query=True)[0]
    assert not np.allclose(q, docs[0], atol=1e-3), "the query instruction must change the query vector"


def test_cache_hits_and_keys(tmp_path, minilm):
    cache = EmbeddingCache(tmp_path / "e.sqlite")
    enc = CachedEncoder(minilm, cache)
    a = enc.encode(TEXTS)
    assert enc.misses == 3 and enc.hits == 0  # the duplicate text is encoded once
    b = enc.encode(TEXTS)
    assert enc.hits == 4 and enc.misses == 3
    np.testing.assert_array_equal(a, b)
    # Queries and documents are cached apart (an instruction may differ).
    assert EmbeddingCache.key(enc.id, True, "t") != EmbeddingCache.key(enc.id, False, "t")
    # A second process sees the same cache file.
    enc2 = CachedEncoder(minilm, EmbeddingCache(tmp_path / "e.sqlite"))
    enc2.encode(TEXTS[:2])
    assert enc2.misses == 0


def test_encoder_errors(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        HFEncoder(tmp_path)
    with pytest.raises(ConfigError, match="unknown encoder"):
        get_encoder("sentence-transformers/all-MiniLM-L6-v2", cache=False)


@pytest.mark.cuda
def test_minilm_on_cuda_runs_fp16_within_tolerance():
    """On a CUDA host the encoder runs in fp16; its vectors stay within 1e-2 cosine of the
    CPU fp32 ones (the tolerance fp16 accumulation allows for 6 layers of MiniLM)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gpu = minilm_encoder(device="cuda")
    assert next(gpu.model.parameters()).dtype == torch.float16
    cpu = minilm_encoder(device="cpu").encode(TEXTS)
    v = gpu.encode(TEXTS)
    assert v.dtype == np.float32
    np.testing.assert_allclose((v * cpu).sum(1), 1.0, atol=1e-2)


def test_length_sorted_batches_keep_input_order_on_mixed_lengths(minilm):
    """Texts of very different lengths, batched after sorting by length, come back in input
    order and equal their one-by-one vectors (padding does not leak into mean pooling)."""
    texts = ["short", "a " * 200 + "long one", "mid length text about a pottery class", "x y", "b " * 50]
    v = minilm.encode(texts, batch_size=2)
    singles = np.stack([minilm.encode([t])[0] for t in texts])
    np.testing.assert_allclose(v, singles, atol=1e-5)


def test_onnx_runtime_same_vectors_and_id(tmp_path, minilm, monkeypatch):
    """ONNX Runtime (optional extra): exported once into the cache, same id, vectors within the
    stated tolerance of torch's on mixed-length batches and queries."""
    pytest.importorskip("onnxruntime", reason="the optional extra `onnx` is not installed")
    from trawmem_gpu.encode import _load, encoder_runtime
    from trawmem_gpu.encode.onnx import TOLERANCE, OnnxEncoder

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path))
    enc = OnnxEncoder(minilm)
    assert enc.id == minilm.id and enc.max_abs_diff <= TOLERANCE
    assert len(list((tmp_path / "onnx").glob("*.onnx"))) == 1
    texts = TEXTS + ["b " * 300, "[2031/05/13 (Tue) 04:17] user: where did I go?"]
    np.testing.assert_allclose(enc.encode(texts, batch_size=3), minilm.encode(texts, batch_size=3), atol=TOLERANCE)
    np.testing.assert_allclose(enc.encode(texts, is_query=True), minilm.encode(texts, is_query=True), atol=TOLERANCE)
    monkeypatch.setenv("TRAWMEM_ENCODER_RUNTIME", "onnx")
    assert encoder_runtime() == "onnx" and isinstance(_load("minilm", "onnx"), OnnxEncoder)
    monkeypatch.setenv("TRAWMEM_ENCODER_RUNTIME", "tpu")
    with pytest.raises(ConfigError, match="TRAWMEM_ENCODER_RUNTIME"):
        get_encoder()


@pytest.mark.parametrize("verbose", ["", "1"])
def test_no_weight_loading_bar_unless_verbose(monkeypatch, capfd, verbose):
    """transformers prints ``Loading weights 0/103 ... 103/103`` for every model load; it is hidden
    unless TRAWMEM_VERBOSE=1 asks for it, and its global switch is left as it was."""
    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("TRAWMEM_VERBOSE", verbose)
    capfd.readouterr()
    minilm_encoder(device="cpu")
    err = capfd.readouterr().err
    assert ("Loading weights" in err) == bool(verbose), err[-300:]
    assert hf_logging.is_progress_bar_enabled()


class _Counting(Encoder):
    """A toy encoder (vector from the text's length and first letter) that can fail at batch N."""

    id, dim = "toy-encoder", 4

    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.batches = fail_at, 0

    def _encode_batch(self, texts, is_query):
        self.batches += 1
        if self.batches == self.fail_at:
            raise KeyboardInterrupt  # a kill in the middle of a build
        return np.array([[len(t), ord(t[0]), 1.0, 2.0] for t in texts], dtype=np.float32)


def test_cache_is_written_per_batch_so_a_kill_loses_at_most_one(tmp_path):
    texts = [f"text number {i}" for i in range(10)]
    enc = CachedEncoder(_Counting(fail_at=3), EmbeddingCache(tmp_path / "e.sqlite"))
    with pytest.raises(KeyboardInterrupt):
        enc.encode(texts, batch_size=2)
    again = CachedEncoder(_Counting(), EmbeddingCache(tmp_path / "e.sqlite"))
    ticks = []
    v = again.encode(texts, batch_size=2, on_batch=ticks.append)
    assert again.hits == 4 and again.misses == 6  # the two batches before the kill were kept
    assert ticks == [4, 2, 2, 2]  # the cache hits at once, then one tick per encoded batch
    np.testing.assert_allclose(v, CachedEncoder(_Counting(), None).encode(texts, batch_size=2), atol=1e-6)


def test_progress_ticks_count_every_text_with_repeats(tmp_path):
    texts = ["b", "a", "b", "c", "a"]
    ticks = []
    enc = CachedEncoder(_Counting(), EmbeddingCache(tmp_path / "e.sqlite"))
    enc.encode(texts, batch_size=2, on_batch=ticks.append)
    assert sum(ticks) == len(texts) and enc.misses == 3
    plain = []
    _Counting().encode(texts, batch_size=2, on_batch=plain.append)
    assert plain == [2, 2, 1]
