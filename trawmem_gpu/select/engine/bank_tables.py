"""The engine's per-bank, query-independent tables (``engine.tables`` stores them for many banks).

Per bank (:func:`build_bank`): unit and head vectors, each unit's bank-local thread, the unit
features that do not depend on the query (cosine to its head, temporal flag, position), whether
the unit has a support link (``linked``: a unit view's fact or its source, ``facts.view``), the
in-thread distance ``d_in`` (step 5), the modular terms' unit attributes, the token costs of the
units and thread headings (``workspace.token_costs``; a token budget reads them), the thread graph as
padded neighbour lists, its BM25 score matrix (CSC), its support links by row (linear in the
links), and, for a bank of at most ``EngineConfig.table_max_units`` units while the banks' tables fit
in ``EngineConfig.table_bytes``: the support kernel ``K_b [N, N]`` (a candidate set's K is then a
gather, never an ``E E^T`` product) and ``btab [N, J]`` = each unit's best cosine per thread (the
bridge feature is a max over T entries instead of U, and the compiled greedy's step-0 bounds
read it). A larger bank has neither (``BankInfo.tables`` False): they grow as ``N^2``, so its
queries form K and the bridge from their candidates' vectors (``[U, U]`` per query, the same
values). Everything else stored per bank is linear in its units, threads, edges and postings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ...store.graph import SEMANTIC
from ...store.bank import Bank
from ...store.turn_columns import embed_texts
from ..lexical import BM25Index
from ..objective import support_floor, support_kernel, support_links
from ..support import SupportLinks
from .extend import EXTENDED, extend_arrays, kept_prefix, whole_arrays


class Layout(NamedTuple):
    """How tables are built: device and dtype of the device tables, and which optional ones."""

    device: torch.device
    dtype: torch.dtype
    dim: int
    with_tables: bool
    """Build ``ktab`` / ``btab``."""
    lexical: bool
    """Build BM25 (the affinity reads it)."""
    heads: bool
    """Store the head vectors (head or max seeds read them; best-unit seeds do not)."""
    relevance: bool = False
    """Store the ``learned`` affinity's per-unit indices (speaker, session neighbours)."""
    tokens: bool = True
    """Count the units' and headings' token costs (any query's token budget reads them; else zeros)."""
    table_units: int | None = None
    """With ``with_tables``: build them only for banks of at most this many units (None: any)."""
    vec_dtype: torch.dtype | None = None
    """dtype of the ``unit_vecs`` table (None: ``dtype``). float32 on a float64 CPU engine over
    float32 vectors (``Plan.layout``): the bank's own values, half the bytes of a float64 copy; a
    reader casts the rows it gathers (:func:`engine.tables.unit_rows`), float32 -> float64 exact,
    so every product is the float64 table's."""
    w_dtype: torch.dtype | None = None
    """dtype of the ``nbw`` table (the thread graph's edge weights; None: ``dtype``). float32 on a
    float64 CPU engine whose first banks' weights are float32 (every bank the package builds or
    loads: ``store/graph.py``, ``store/files.py``), half the bytes; the compiled loops read each
    weight into float64 arithmetic and the torch readers cast the rows they gather, float32 ->
    float64 exact, so every cost and relaxation is the float64 table's. A later bank whose weights
    float32 cannot hold exactly is refused (``build_bank``), never rounded."""
    mapped_units: int | None = None
    """Banks of at least this many units whose vectors are float32 keep no ``unit_vecs`` rows
    (:attr:`BankInfo.mapped`; None: every bank has them). ``Plan.layout`` sets it to the
    approximate path's threshold on a float64 CPU engine with the compiled front, the one path
    whose readers gather such a bank's rows from ``Bank.unit_vecs`` (:func:`engine.tables.unit_block`)."""


class Hole:
    """``n`` rows of a table that a bank keeps out of its buffer (:attr:`BankInfo.mapped`: its
    ``unit_vecs`` are read from the bank's own, memory-mapped vectors): reserved, never written,
    read or copied (``tables._Segment.holes``)."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = int(n)

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True, eq=False)
class BankInfo:
    """The Python side of one stored bank."""

    bank: Bank
    n_units: int
    n_threads: int
    long_threads: np.ndarray
    """``[J + 1]`` units in the bank's ``h`` longest threads, for every ``h`` (a cumulative sum):
    a query whose neighbourhood holds at most ``h`` threads has at most ``long_threads[h]``
    candidates (:meth:`Snapshot.unit_cap`)."""
    bm25: BM25Index | None
    vocab: dict | None
    plain: bool
    """bm25s keeps a plain float32 score matrix (no non-occurrence term): the batched BM25 applies."""
    speakers: tuple = ()
    """The bank's speakers (the ``learned`` affinity's ``speaker_named`` feature indexes them)."""
    costs: object = None
    """The bank's ``workspace.TokenCosts`` (with heads), read under a token budget."""
    tables: bool = False
    """The bank's ``ktab`` / ``btab`` are stored (else its queries form K and the bridge per query)."""
    links: SupportLinks | None = None
    """The bank's support links (``objective.support_links``), None without any."""
    arrays: dict = field(default_factory=dict, repr=False)
    """The bank's per-unit arrays an append's tables extend (``engine/extend.py``: ``EXTENDED``);
    empty where the store's rows are those values (:func:`store_holds`: a CPU engine whose tables
    have the arrays' dtypes), which an append reads instead (``Snapshot.unit_rows``)."""
    mapped: bool = False
    """The bank's unit vectors are read from ``bank.unit_vecs`` (a loaded bank's memory-mapped
    float32 file), not from the ``unit_vecs`` table, which reserves its rows as a hole
    (``tables.Hole``: no resident copy; ``Layout.mapped_units``)."""
    cache: dict = field(default_factory=dict, repr=False)
    """What is built for this bank on first use and kept while the bank is (its approximate
    indexes, ``engine/shortlist.py``, ``steps/seeds.py``): later snapshots share it."""


# (table, group, dtype kind, fill) -- the rows of one group are appended together, per bank. The
# bank-local ids of ``nbr`` (threads), ``bm_idx`` (units) and ``rel_idx`` (speaker, previous and
# next unit) are int32 (a bank holds fewer than 2^31 of each, ``build_bank`` checks): half the
# bytes of int64, 83 MiB less at 10^6 units, the same values (``tests/select/test_table_dtypes.py``);
# a torch reader that indexes with them casts the rows it gathers to int64. ``nbw`` is
# ``Layout.w_dtype`` ("weight"). ``temporal`` and ``linked`` (0 or 1) and ``tok_unit`` (whole token
# counts, below 2^24: ``build_bank`` refuses more, never rounds) are float32 ("flag"): every value
# exact, so the float64 readers read the float64 table's values; 11.4 MiB less at 10^6 units.
TABLES = (
    ("unit_vecs", "unit", "vec", 0), ("unit_thread", "unit", "int", 0), ("head_sim", "unit", "float", 0),
    ("temporal", "unit", "flag", 0), ("position", "unit", "float", 0), ("d_in", "unit", "float", 0),
    ("attrs", "unit", "float64", 0), ("rel_idx", "unit", "int32", -1), ("rel_words", "unit", "float64", 0),
    ("tok_unit", "unit", "flag", 0),
    ("linked", "unit", "flag", 0),
    ("head_vecs", "thread", "float", 0), ("nbr", "thread", "int32", -1), ("nbw", "thread", "weight", 0),
    ("tok_head", "thread", "float", 0), ("tok_hrun", "thread", "int", 0),
    ("ktab", "k", "float", 0), ("btab", "b", "float", 0),
    ("bm_data", "nz", "float32", 0), ("bm_idx", "nz", "int32", 0), ("bm_ptr", "col", "int", 0),
)
FLAG_LIMIT = 1 << 24
"""Token costs of one unit the float32 ``tok_unit`` table holds exactly (any whole number below it)."""
ID_LIMIT = 1 << 31
"""Units and threads of one bank the int32 tables (``nbr``, ``bm_idx``, ``rel_idx``) can number."""
HOST_GROUPS = ("nz", "col")
"""BM25 stays on the CPU (the text stage is CPU work)."""


def table_dtype(kind: str, layout: Layout) -> torch.dtype:
    """The dtype of a table of ``TABLES``' ``kind`` under ``layout``."""
    return {"float": layout.dtype, "vec": layout.vec_dtype or layout.dtype, "int": torch.int64, "int32": torch.int32,
            "float64": torch.float64, "float32": torch.float32, "flag": torch.float32, "weight": layout.w_dtype or layout.dtype}[kind]


def store_holds(arrays: dict, layout: Layout) -> bool:
    """Whether the store's rows of the tables ``arrays`` names are those arrays value for value
    (host tables of their very dtypes): then ``BankInfo.arrays`` need not keep them
    (``TableStore.prepare`` reads them back, ``Snapshot.unit_rows``)."""
    kinds = {name: kind for name, _, kind, _ in TABLES}
    return layout.device.type == "cpu" and all(
        isinstance(v, np.ndarray) and v.dtype == torch.empty(0, dtype=table_dtype(kinds[k], layout)).numpy().dtype
        for k, v in arrays.items())


def build_bank(bank: Bank, cfg, layout: Layout, prev: BankInfo | None = None,
               postings: np.ndarray | None = None, stored: dict | None = None) -> tuple[BankInfo, dict[str, np.ndarray]]:
    """One bank's info and arrays (NumPy, or tensors on the device; the store copies them). ``prev``:
    the info of the bank the engine holds under that id; where ``bank`` is an append to it, only
    the new threads' rows are computed (``engine/extend.py``); ``postings``: ``prev``'s ``bm_idx``
    rows as the store holds them (its lean BM25 index's postings' units, ``BM25Index.appended``);
    ``stored``: ``prev``'s ``EXTENDED`` rows as the store holds them, where ``prev.arrays`` is
    empty (:func:`store_holds`: the info keeps no second copy of them, about 78 MiB at 10^6 units).

    A plain BM25 index's score matrix is copied into the ``bm_*`` tables and the info keeps the
    index :meth:`~trawmem_gpu.select.lexical.BM25Index.lean` (no second copy of ``data`` and
    ``indices``: about 72 MiB at 10^6 units); nothing scores with it (the batched BM25 reads the
    tables), and an append reads its units back from the store (``TableStore.prepare``)."""
    prev_arrays = None if prev is None else (prev.arrays or stored)
    kept = kept_prefix(prev.bank, bank) if prev_arrays else None
    bank.validate(kept or (0, 0))
    if bank.unit_vecs.shape[1] != layout.dim:
        raise ValueError(f"bank {bank.bank_id!r} has {bank.unit_vecs.shape[1]}-dimensional vectors, the engine "
                         f"{layout.dim}")
    N, J = bank.n_units, bank.n_threads
    if max(N, J) >= ID_LIMIT:
        raise ValueError(f"bank {bank.bank_id!r} has {N} units and {J} threads: the engine's int32 ids hold fewer "
                         f"than {ID_LIMIT}")
    _check_weights(bank, layout)
    part = None if kept is None else extend_arrays(bank, cfg, layout, prev, prev_arrays, *kept, postings)
    a, costs, speakers, bm25 = part or whole_arrays(bank, cfg, layout)
    a["nbr"], a["nbw"] = _neighbours(bank, cfg.semantic_edges)
    links = support_links(bank, cfg)
    a["linked"] = np.zeros(N, np.float32) if links is None else links.linked().astype(np.float32)  # 0 / 1
    _check_flags(bank, a["tok_unit"])
    a["tok_unit"] = a["tok_unit"].astype(np.float32)
    own = {k: a[k] for k in EXTENDED if k in a}  # what a later append's tables start from (engine/extend.py)
    own = {} if store_holds(own, layout) else own  # ... read back from the store's rows
    tables = has_tables(N, layout)
    if tables:
        a["ktab"], a["btab"] = _kernel_tables(bank, cfg, layout, support_floor(bank, cfg))
    vocab, plain = None, False
    if layout.lexical:
        bm25 = bm25 or BM25Index(embed_texts(bank.turns))  # a loaded bank's lines from its columns
        vocab = bm25.vocab
        m = bm25.model
        plain = getattr(m, "nonoccurrence_array", None) is None and isinstance(m.scores, dict)
        if plain:
            a["bm_data"], a["bm_idx"] = m.scores["data"], m.scores["indices"]
            a["bm_ptr"] = m.scores["indptr"]
            bm25 = bm25.lean() if bm25._post is not None else bm25
    long_threads = np.concatenate([[0], np.cumsum(np.sort(np.diff(bank.thread_offsets))[::-1])]).astype(np.int64)
    mapped = plain and is_mapped(bank, layout)  # the compiled front reads it (a plain BM25: engine._picks)
    if mapped:
        a["unit_vecs"] = Hole(N)
    info = BankInfo(bank, N, J, long_threads, bm25, vocab, plain, speakers, costs, tables, links, arrays=own,
                    mapped=mapped)
    if kept is not None:
        info.cache.update(grown_indexes(prev, bank, kept[0]))
    return info, a


def _check_weights(bank: Bank, layout: Layout) -> None:
    """A ``ValueError`` when ``layout`` stores the edge weights as float32 and ``bank``'s are not
    all exactly float32 values (they would be rounded: other picks than a float64 table's)."""
    if layout.w_dtype != torch.float32 or bank.edge_w.dtype in (np.float32, np.float16):
        return
    w = np.asarray(bank.edge_w, dtype=np.float64)
    if not np.array_equal(w.astype(np.float32).astype(np.float64), w):
        raise ValueError(f"bank {bank.bank_id!r}: edge weights that float32 cannot hold exactly, in an engine whose "
                         f"weight table is float32 (its first banks' weights were float32); build the engine with it")


def _check_flags(bank: Bank, tok_unit: np.ndarray) -> None:
    """A ``ValueError`` where a unit's token cost is not a whole number below ``FLAG_LIMIT`` (the
    float32 ``tok_unit`` table would round it)."""
    t = np.asarray(tok_unit, dtype=np.float64)
    if len(t) and (t.max() >= FLAG_LIMIT or t.min() < 0 or not np.array_equal(t, np.floor(t))):
        raise ValueError(f"bank {bank.bank_id!r}: a unit's token cost that the float32 table cannot hold exactly "
                         f"(whole numbers below {FLAG_LIMIT})")


def grown_indexes(prev: BankInfo, bank: Bank, start: int) -> dict:
    """The approximate unit indexes ``prev`` built (``engine/shortlist.py``'s ``unit_index``), grown
    for ``bank``, an append that keeps ``prev``'s units before ``start`` (``VectorIndex.grown``: no
    rebuild), under ``("grown", *key)`` for ``unit_index`` to take up on its first use (one not
    taken up yet grows again)."""
    out = {}
    for key, got in list(prev.cache.items()):
        if isinstance(key, tuple) and key and key[0] in ("unit_index", "grown"):
            index = got[0] if key[0] == "unit_index" else got  # "grown": one not yet taken up
            name = key if key[0] == "grown" else ("grown", *key)
            out[name] = index.grown(bank.unit_vecs[start:], start, bank.unit_vecs)
    return out


def is_mapped(bank: Bank, layout: Layout) -> bool:
    """Whether ``bank``'s unit vectors stay in the bank (``Layout.mapped_units``): a bank that
    large, with float32 vectors (read and cast to float64 exactly, as the float32 table's rows)."""
    return (layout.mapped_units is not None and bank.n_units >= layout.mapped_units
            and np.asarray(bank.unit_vecs).dtype == np.float32)


def has_tables(n_units: int, layout: Layout) -> bool:
    """Whether a bank of ``n_units`` units gets its ``ktab`` / ``btab`` under ``layout``."""
    return layout.with_tables and (layout.table_units is None or n_units <= layout.table_units)


def _neighbours(bank: Bank, semantic: bool) -> tuple[np.ndarray, np.ndarray]:
    """G_H as padded neighbour lists ``[J, D_b]`` (bank-local ids, -1 = none) and weights; semantic
    edges dropped when the config says so; a repeated (src, dst) keeps its largest weight (what a
    max-over-paths relaxation sees)."""
    keep = np.ones(len(bank.edge_src), dtype=bool) if semantic else (bank.edge_kind != SEMANTIC)
    src, dst = bank.edge_src[keep].astype(np.int64), bank.edge_dst[keep].astype(np.int64)
    w = bank.edge_w[keep].astype(np.float64)
    order = np.lexsort((-w, dst, src))
    src, dst, w = src[order], dst[order], w[order]
    first = np.ones(len(src), dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    src, dst, w = src[first], dst[first], w[first]
    J = bank.n_threads
    deg = np.bincount(src, minlength=J)
    D = max(1, int(deg.max()) if len(deg) else 1)
    slot = np.arange(len(src)) - np.concatenate([[0], np.cumsum(deg)])[src]
    nbr = np.full((J, D), -1, dtype=np.int64)
    nbw = np.zeros((J, D))
    nbr[src, slot] = dst
    nbw[src, slot] = w
    return nbr, nbw


def _kernel_tables(bank: Bank, cfg, layout: Layout, floor=None) -> tuple[Tensor | None, Tensor]:
    """``(ktab [N * N], btab [N * J])``: the bank's support kernel (the objective's
    ``support_kernel`` of its Gram matrix and support ``floor``, so a gather gives exactly a
    candidate set's K) and each unit's best cosine per thread."""
    E = torch.as_tensor(np.ascontiguousarray(bank.unit_vecs), dtype=layout.dtype, device=layout.device)
    G = E @ E.T
    lt = torch.as_tensor(bank.unit_thread, device=layout.device)
    N, J = bank.n_units, bank.n_threads
    bt = torch.full((N, J), float("-inf"), dtype=layout.dtype, device=layout.device)
    bt.scatter_reduce_(1, lt[None, :].expand(N, N), G, reduce="amax", include_self=True)
    if cfg.kernel == "identity":
        return None, bt.flatten()
    fl = None if floor is None else torch.as_tensor(floor, dtype=layout.dtype, device=layout.device)
    return support_kernel(G, lt[:, None] == lt[None, :], cfg, fl).flatten(), bt.flatten()


def table_bytes_needed(banks: list[Bank], cfg, element_size: int, max_units: int | None = None) -> int:
    """Bytes ``ktab`` and ``btab`` need for those of ``banks`` with at most ``max_units`` units (None: all)."""
    banks = [b for b in banks if max_units is None or b.n_units <= max_units]
    k = 0 if cfg.kernel == "identity" else sum(b.n_units ** 2 for b in banks)
    return (k + sum(b.n_units * b.n_threads for b in banks)) * element_size
