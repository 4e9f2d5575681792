"""Banks packed into flat tensors (torch, on one device) for batched engines."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BankError, UnknownBank, name_list
from .bank import Bank


@dataclass
class PackedCollection:
    """Banks concatenated into flat tensors (torch, on one device), with CSR offsets.

    Global unit ``i`` belongs to bank ``unit_bank[i]`` and global thread ``unit_thread[i]``;
    bank ``b`` owns units ``bank_unit_offsets[b]:bank_unit_offsets[b+1]`` and threads
    ``bank_thread_offsets[b]:...``; thread ``t`` owns units ``thread_offsets[t]:...``; the
    thread graph is CSR over global thread ids (``edge_offsets``, ``edge_dst``, ``edge_w``).
    """

    bank_ids: list[str]
    unit_vecs: "object"
    head_vecs: "object"
    bank_unit_offsets: "object"
    bank_thread_offsets: "object"
    thread_offsets: "object"
    unit_thread: "object"
    unit_bank: "object"
    thread_bank: "object"
    edge_offsets: "object"
    edge_dst: "object"
    edge_w: "object"
    banks: list[Bank]

    @property
    def device(self):
        return self.unit_vecs.device

    def bank_index(self, bank_id: str) -> int:
        try:
            return self._index[bank_id]
        except AttributeError:
            self._index = {b: i for i, b in enumerate(self.bank_ids)}
            return self.bank_index(bank_id)
        except KeyError:
            raise UnknownBank(bank_id, detail=f" (packed: {name_list(self.bank_ids)})") from None

    def nbytes(self) -> int:
        return sum(getattr(self, f).element_size() * getattr(self, f).nelement() for f in
                   ("unit_vecs", "head_vecs", "bank_unit_offsets", "bank_thread_offsets", "thread_offsets",
                    "unit_thread", "unit_bank", "thread_bank", "edge_offsets", "edge_dst", "edge_w"))


def pack_banks(banks: list[Bank], device: str | None = None, dtype=None) -> PackedCollection:
    """Concatenate banks into device tensors (CUDA when present unless ``device`` says otherwise)."""
    import torch

    if not banks:
        raise BankError("cannot pack an empty list of banks")
    dims = {b.unit_vecs.shape[1] for b in banks}
    if len(dims) != 1:
        raise BankError(f"banks have different vector sizes {sorted(dims)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or torch.float32
    nu = np.array([b.n_units for b in banks])
    nt = np.array([b.n_threads for b in banks])
    buo = np.concatenate([[0], np.cumsum(nu)])
    bto = np.concatenate([[0], np.cumsum(nt)])
    toff = np.concatenate([[0]] + [b.thread_offsets[1:] + buo[i] for i, b in enumerate(banks)])
    src = np.concatenate([b.edge_src + bto[i] for i, b in enumerate(banks)])
    dst = np.concatenate([b.edge_dst + bto[i] for i, b in enumerate(banks)])
    w = np.concatenate([b.edge_w for b in banks])
    order = np.lexsort((dst, src))
    src, dst, w = src[order], dst[order], w[order]
    eoff = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=int(bto[-1])))])
    unit_thread = np.repeat(np.arange(int(bto[-1])), np.diff(toff))
    T = lambda a, dt=torch.int64: torch.as_tensor(np.ascontiguousarray(a), dtype=dt, device=device)
    return PackedCollection(
        bank_ids=[b.bank_id for b in banks],
        unit_vecs=T(np.concatenate([b.unit_vecs for b in banks]), dtype),
        head_vecs=T(np.concatenate([b.head_vecs for b in banks]), dtype),
        bank_unit_offsets=T(buo), bank_thread_offsets=T(bto), thread_offsets=T(toff),
        unit_thread=T(unit_thread), unit_bank=T(np.repeat(np.arange(len(banks)), nu)),
        thread_bank=T(np.repeat(np.arange(len(banks)), nt)),
        edge_offsets=T(eoff), edge_dst=T(dst), edge_w=T(w, torch.float32), banks=banks)
