"""ONNX Runtime for mean-pooling encoders on the CPU: the same vectors, in less CPU time.

The local transformers model (e.g. the embedded all-MiniLM-L6-v2) is exported once with
``torch.onnx.export`` into the cache directory (atomically, under a file lock) with the mean
pooling inside the graph, then run by ``onnxruntime`` (a maintained inference runtime with
fused attention kernels for CPUs). The exported encoder keeps the torch encoder's id, because
it produces the same vectors: on construction it encodes probe texts with both and refuses to
run (``ConfigError``) if any component differs by more than :data:`TOLERANCE`. Its speed and
agreement with torch are recorded by ``benchmarks/bench_longmemeval.py`` (docs/design-notes.md).

Optional extra ``onnx`` (``onnxruntime``, ``onnx``); CUDA hosts keep the torch encoder (fp16).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .base import Encoder
from .hf import HFEncoder

TOLERANCE = 1e-5
"""Largest accepted |difference| of any vector component from the torch encoder's."""
PROBE = ["a short one", "I spent ten dollars on a coffee mug for each coworker last week",
         "x", "[2031/05/13 (Tue) 04:17] user: " + "a much longer text about a pottery class " * 12]


def _export(hf: HFEncoder, path: Path) -> None:
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            h = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
            mask = attention_mask.unsqueeze(-1).float()
            return (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    b = hf.tok(PROBE[:2], padding=True, return_tensors="pt")
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    model = Pooled(hf.model.float().cpu()).eval()
    with torch.inference_mode():
        torch.onnx.export(model, (b["input_ids"], b["attention_mask"]), str(tmp), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["vec"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                                        "attention_mask": {0: "batch", 1: "tokens"}, "vec": {0: "batch"}})
    os.replace(tmp, path)


def exported_model(hf: HFEncoder, cache_dir: str | Path | None = None) -> Path:
    """The ONNX file for ``hf`` (exported on first use, shared by every later process)."""
    from filelock import FileLock

    from ..paths import default_cache_dir

    root = Path(hf.path)
    h = hashlib.sha256(hf.id.encode())
    for f in sorted(root.iterdir()):
        if f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    d = Path(cache_dir) if cache_dir else default_cache_dir() / "onnx"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{h.hexdigest()[:16]}.onnx"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            _export(hf, path)
    return path


class OnnxEncoder(Encoder):
    """A mean-pooling :class:`HFEncoder` run by ONNX Runtime (same id, same vectors within
    :data:`TOLERANCE`)."""

    def __init__(self, hf: HFEncoder, *, threads: int | None = None, cache_dir: str | Path | None = None):
        if hf.pooling != "mean":
            raise ConfigError(f"the ONNX runtime serves mean-pooling encoders; {hf.id} uses {hf.pooling} pooling")
        try:
            import onnxruntime as ort
        except ImportError:
            raise ConfigError("the ONNX encoder runtime needs `pip install -e .[onnx]` (onnxruntime, onnx)") from None
        import torch

        self.tok, self.max_length, self.query_instruction = hf.tok, hf.max_length, hf.query_instruction
        self.id, self.dim = hf.id, hf.dim
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads or torch.get_num_threads())
        self.session = ort.InferenceSession(str(exported_model(hf, cache_dir)), so, providers=["CPUExecutionProvider"])
        ref, got = hf.encode(PROBE), self.encode(PROBE)
        err = float(np.abs(ref - got).max())
        if not err <= TOLERANCE:
            raise ConfigError(f"ONNX Runtime vectors differ from torch's by {err:.2e} (> {TOLERANCE}); "
                              "use TRAWMEM_ENCODER_RUNTIME=torch")
        self.max_abs_diff = err

    def _encode_batch(self, texts: list[str], is_query: bool) -> np.ndarray:
        if is_query and self.query_instruction:
            texts = [self.query_instruction + t for t in texts]
        b = self.tok(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="np")
        feed = {"input_ids": b["input_ids"].astype(np.int64), "attention_mask": b["attention_mask"].astype(np.int64)}
        return self.session.run(None, feed)[0].astype(np.float32)
