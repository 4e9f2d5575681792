"""Many banks in one directory, and their packing into flat tensors for batched engines.

Layout: ``DIR/collection.json`` (format version, encoder id, bank id -> subdirectory) and one
bank directory per bank under ``DIR/banks/``. The index file is replaced atomically after each
bank write, so it never names a bank that is not fully on disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BankError
from .bank import Bank
from .files import FORMAT_VERSION, load_bank, save_bank

INDEX = "collection.json"


def _dirname(bank_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", bank_id)[:80] or "bank"
    if safe != bank_id:
        safe += "-" + hashlib.sha1(bank_id.encode()).hexdigest()[:8]
    return safe


class Collection:
    """A directory of banks. ``Collection(dir)`` opens (or starts) one."""

    def __init__(self, path: str | Path, *, create: bool = False):
        self.path = Path(path)
        ip = self.path / INDEX
        if ip.exists():
            try:
                idx = json.loads(ip.read_text(encoding="utf-8"))
                if idx.get("format_version") != FORMAT_VERSION:
                    raise BankError(f"{ip}: collection format version {idx.get('format_version')!r}, "
                                    f"expected {FORMAT_VERSION}; rebuild with `trawmem build`")
                self.banks: dict[str, str] = dict(idx["banks"])
                self.encoder_id: str | None = idx.get("encoder_id")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise BankError(f"{ip}: corrupt collection index ({e})") from None
        elif create:
            self.banks, self.encoder_id = {}, None
        elif (self.path / "meta.json").exists():
            raise BankError(f"{self.path} is a single bank, not a collection; open it with load_bank()")
        else:
            raise BankError(f"{self.path}: not a collection (missing {INDEX})")

    def __len__(self) -> int:
        return len(self.banks)

    def __contains__(self, bank_id: str) -> bool:
        return bank_id in self.banks

    @property
    def bank_ids(self) -> list[str]:
        return list(self.banks)

    def bank_path(self, bank_id: str) -> Path:
        if bank_id not in self.banks:
            known = ", ".join(list(self.banks)[:5])
            raise KeyError(f"unknown bank id {bank_id!r} in {self.path} (has {len(self.banks)}: {known}...)")
        return self.path / "banks" / self.banks[bank_id]

    def load(self, bank_id: str) -> Bank:
        return load_bank(self.bank_path(bank_id))

    def load_all(self) -> list[Bank]:
        return [self.load(b) for b in self.banks]

    def put(self, bank: Bank) -> None:
        """Write (or replace) one bank, then the index, each atomically."""
        if self.encoder_id is not None and bank.encoder_id != self.encoder_id:
            raise BankError(f"bank {bank.bank_id!r} was encoded with {bank.encoder_id!r}, the collection "
                            f"with {self.encoder_id!r}; one collection holds one embedding space")
        self.encoder_id = bank.encoder_id
        name = self.banks.get(bank.bank_id) or _dirname(bank.bank_id)
        save_bank(bank, self.path / "banks" / name)
        self.banks[bank.bank_id] = name
        self._write_index()

    def _write_index(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / (INDEX + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format_version": FORMAT_VERSION, "encoder_id": self.encoder_id, "banks": self.banks}, f,
                      indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / INDEX)


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
            raise KeyError(f"unknown bank id {bank_id!r}") from None

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
