"""LangGraph (the ``langchain`` extra): ``TrawMemStore``, a ``BaseStore`` over a collection, so a
graph's ``store`` (``StateGraph.compile(store=...)``, ``runtime.store``, LangMem) keeps its items as
turns of a ``Memory`` and its semantic ``search`` is the engine's token-budgeted selection.

::

    from trawmem_gpu.integrations.langgraph import TrawMemStore

    store = TrawMemStore("memories/", token_budget=400)
    store.put(("ana", "prefs"), "food", {"text": "Ana is vegetarian and loves Thai food."})
    store.search(("ana",), query="What should I cook for Ana?", limit=5)   # best first

**Namespaces.** ``namespace[0]`` is the bank (``bank_id=None``, the default: one bank per user or
tenant, its id the store's id rules), or every namespace lives in the one bank ``bank_id``. The
whole namespace is kept on each turn as metadata: ``lg_ns`` (the labels joined by ``.``, which no
label holds), ``lg_depth``, ``lg_ns.<i>`` (label ``i``) and ``lg_nsr.<i>`` (label ``i`` from the
end), so a namespace prefix or suffix (``*`` a wildcard) is a ``where`` filter (``data.filters``),
never a scan of the values. At most :data:`MAX_DEPTH` labels.

**Items.** An item is one turn, id ``lg-<sha256 of namespace and key>-<version>``, speaker
``speaker``. Its text is its value's ``text_key`` field, else ``text``, else ``content`` (a string;
a non-string ``content``, LangMem's structured memories, as its compact JSON); a value without one
is an ``InputError`` naming ``value.text``. The value is kept whole, in metadata: each top-level
string / number / boolean field that metadata can hold as ``v:<field>`` (what ``filter`` reads),
the rest as JSON (``lg_val.<i>``, in :data:`CHUNK` character parts), the text field as the turn's
text; ``get`` and ``search`` return it equal to what was put. ``lg_key``, ``lg_created``,
``lg_updated`` keep the key and the times (a replacing put keeps ``created_at``).

**Writes.** ``put`` is ``Memory.add(messages=..., atomic=True)`` (one call per bank for a batch);
a put on an existing key adds the new version first and then forgets the old one
(``Memory.forget``): a crash between the two leaves both, reads return the newer, and the next
put or delete of the key forgets every older one; never neither. ``delete`` is ``Memory.forget``:
no file of the collection keeps the text afterwards. A batch is checked whole before any write
(a refusal stores nothing) and its reads see the store as it was before its writes
(``InMemoryStore``'s order); ``index`` is ignored (the engine indexes every item's text); no TTL.

**Search.** With a ``query``: ``Memory.select`` (``select_many`` over every bank for an empty
prefix) under the token budget (the run's ``config["configurable"]["trawmem_token_budget"]``,
else the constructor's ``token_budget``) and at most ``offset + limit`` units, among the items
passing the prefix and ``filter``; the items come best first (the engine's pick order,
``SelectedWorkspace.picks``; banks interleaved rank by rank), ``score`` None. Without a query:
the items passing them, in the order they were put, ``offset`` / ``limit`` paging. ``filter``:
``{field: value}`` or ``{field: {"$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte": value}}`` over
the value's top-level fields, translated to ``where`` (the filter language's errors, naming
``filter``). Reads go through ``Memory.turns`` and ``data.filters``; ``abatch`` runs ``batch`` on a
worker thread, off the event loop.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from datetime import datetime, timezone
from typing import Any, Iterable

from langgraph.store.base import (BaseStore, GetOp, InvalidNamespaceError, Item, ListNamespacesOp, PutOp,
                                  SearchItem, SearchOp)

from ..errors import InputError, UnknownBank, loads_json
from .langchain import DEFAULT_TOKEN_BUDGET, _memory, _run_config

MAX_DEPTH = 12
"""Most labels of a namespace (each costs two metadata keys of the 64 a turn may hold)."""
CHUNK = 1000
"""Characters of the value's JSON per metadata key (a string value holds at most 1,024)."""
TEXT_KEYS = ("text", "content")
"""The value fields an item's text is read from, in order, without a ``text_key``."""
OPS = {"$eq": "eq", "$ne": "ne", "$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
"""LangGraph's filter operators -> the filter language's."""


class InvalidNamespace(InputError, InvalidNamespaceError):
    """A namespace LangGraph's rules refuse (an ``InputError`` and LangGraph's ``InvalidNamespaceError``)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def item_id(namespace: tuple[str, ...], key: str) -> str:
    """The hash naming an item (its namespace and key) in its turns' ids and ``lg_id``."""
    return hashlib.sha256(json.dumps([list(namespace), key]).encode()).hexdigest()[:32]


def check_namespace(namespace, name: str = "namespace", *, empty: bool = False, wild: bool = False) -> tuple:
    """``namespace`` as a tuple of labels (LangGraph's rules: strings, not empty, no ``.``); else
    :class:`InvalidNamespace` naming it."""
    if not isinstance(namespace, tuple):
        raise InvalidNamespace(f"{name}: expected a tuple of strings, got {type(namespace).__name__}")
    if not namespace and not empty:
        raise InvalidNamespace(f"{name}: a namespace cannot be empty")
    if len(namespace) > MAX_DEPTH:
        raise InvalidNamespace(f"{name}: {len(namespace)} labels; at most {MAX_DEPTH}")
    for i, label in enumerate(namespace):
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidNamespace(f"{name}[{i}]: a label is a non-empty string without '.', got {label!r:.60}")
    if not wild and namespace and namespace[0] == "langgraph":
        raise InvalidNamespace(f'{name}[0]: the root label cannot be "langgraph"')
    return namespace


def _fits(key: str, value) -> bool:
    """Whether metadata can hold ``value`` under ``key`` (``data.metadata``'s rules, not re-stated)."""
    from ..data.metadata import check_key, check_value

    if isinstance(value, (dict, list, tuple)) or value is None:
        return False
    try:
        check_key(key, None, "metadata")
        check_value(value, key, "metadata")
    except InputError:
        return False
    return True


class TrawMemStore(BaseStore):
    """A LangGraph ``BaseStore`` over a ``Memory`` (module docstring).

    :param memory: a ``Memory`` or a collection path
    :param bank_id: the one bank of every namespace (None: ``namespace[0]`` is the bank)
    :param token_budget: a query search's workspace tokens unless the run's config says otherwise
    :param text_key: the value field holding an item's text (None: ``text``, else ``content``)
    :param speaker: the speaker of the items' turns
    """

    supports_ttl = False

    def __init__(self, memory, *, bank_id: str | None = None, token_budget: int = DEFAULT_TOKEN_BUDGET,
                 text_key: str | None = None, speaker: str = "memory"):
        self.memory = _memory(memory)
        self.bank_id, self.token_budget, self.text_key, self.speaker = bank_id, token_budget, text_key, speaker

    # -- mapping ----------------------------------------------------------------------------------
    def _bank(self, namespace: tuple, name: str = "namespace") -> str:
        from ..memory.banks import check_bank_id

        bank = self.bank_id or namespace[0]
        try:
            check_bank_id(bank)
        except InputError as e:
            raise InputError(f"{name}[0]: not a bank id ({e})") from None
        return bank

    def _banks(self, prefix: tuple) -> list[str]:
        """The banks a prefix can reach (existing ones only)."""
        if self.bank_id is not None:
            return [self.bank_id] if self.bank_id in self.memory else []
        if prefix and prefix[0] != "*":
            return [prefix[0]] if prefix[0] in self.memory else []
        return [b["bank_id"] for b in self.memory.banks() if not b.get("quarantined")]

    @staticmethod
    def _ns_where(path: tuple, suffix: bool = False) -> list[dict]:
        key = "lg_nsr" if suffix else "lg_ns"
        labels = reversed(path) if suffix else path
        return [{"lg_depth": {"gte": len(path)}}] * bool(path) + [
            {f"{key}.{i}": label} for i, label in enumerate(labels) if label != "*"]

    def _where(self, parts: list[dict]):
        from ..data.filters import parse_filter

        return parse_filter({"and": [{"lg_id": {"exists": True}}, *parts]}, "filter")

    @staticmethod
    def _filter(flt) -> list[dict]:
        """LangGraph's ``filter`` over value fields as filter-language conditions on ``v:<field>``."""
        if flt is None:
            return []
        if not isinstance(flt, dict):
            raise InputError(f"filter: expected an object of value fields, got {type(flt).__name__}")
        out = []
        for field, cond in flt.items():
            if not isinstance(field, str) or not _fits(f"v:{field}", "x"):
                raise InputError(f"filter.{field}: only top-level fields named with letters, digits, _ . : - filter")
            if isinstance(cond, dict):
                bad = [k for k in cond if k not in OPS]
                if bad or not cond:
                    raise InputError(f"filter.{field}: operators are {', '.join(OPS)}; got {bad or 'none'}")
                out.append({f"v:{field}": {OPS[k]: v for k, v in cond.items()}})
            else:
                out.append({f"v:{field}": {"eq": cond}})
        return out

    def _text(self, value: dict) -> tuple[str, str]:
        """The value's text field and its text."""
        keys = (self.text_key,) if self.text_key else TEXT_KEYS
        field = next((k for k in keys if k in value), None)
        if field is None:
            raise InputError(f"value.{keys[0]}: the value has no {' or '.join(repr(k) for k in keys)} field to store "
                             "as the item's text (or give TrawMemStore(text_key=...))")
        text = value[field]
        if not isinstance(text, str):
            if field != "content" or self.text_key:
                raise InputError(f"value.{field}: expected a string, got {type(text).__name__}")
            text = json.dumps(text, sort_keys=True, separators=(",", ":"), default=str)
        if not text.strip():
            raise InputError(f"value.{field}: the item's text is empty")
        return field, text

    def _record(self, op: PutOp, old: Item | None) -> tuple[str, dict]:
        """The message ``Memory.add`` stores for a put (checked whole; nothing written here)."""
        ns = op.namespace
        if not isinstance(op.key, str) or not _fits("lg_key", op.key):
            raise InputError(f"key: expected a string of at most 1,024 characters, got {op.key!r:.60}")
        value = op.value
        if not isinstance(value, dict):
            raise InputError(f"value: expected a dict, got {type(value).__name__}")
        field, text = self._text(value)
        now = _now()
        meta: dict[str, Any] = {"lg_id": item_id(ns, op.key), "lg_key": op.key, "lg_ns": ".".join(ns),
                                "lg_depth": len(ns), "lg_created": old.created_at.isoformat() if old else now,
                                "lg_updated": now}
        if not _fits("lg_ns", meta["lg_ns"]):
            raise InvalidNamespace("namespace: its labels are more than 1,024 characters in all")
        for j, label in enumerate(ns):
            meta[f"lg_ns.{j}"], meta[f"lg_nsr.{j}"] = label, ns[-1 - j]
        rest = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InputError(f"value: keys are strings, got {k!r:.60}")
            if k == field and isinstance(v, str):
                meta["lg_text"] = k  # the text field: the turn's text
            elif _fits(f"v:{k}", v):
                meta[f"v:{k}"] = v
            else:
                rest[k] = v
        if rest:
            try:
                blob = json.dumps(rest, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InputError(f"value: not JSON-serializable ({e})") from None
            for j in range(0, len(blob), CHUNK):
                meta[f"lg_val.{j // CHUNK}"] = blob[j:j + CHUNK]
        from ..data.metadata import MAX_METADATA_KEYS

        if len(meta) > MAX_METADATA_KEYS:
            raise InputError(f"value: too large for one item ({len(meta)} metadata keys, at most {MAX_METADATA_KEYS}: "
                             f"fewer fields, a shallower namespace, or less JSON besides the text, {CHUNK} "
                             "characters a key)")
        tid = f"lg-{meta['lg_id']}-{uuid.uuid4().hex[:12]}"
        return self._bank(ns), {"role": "user", "content": text, "id": tid, "metadata": meta}

    @staticmethod
    def _item(meta, text: str, cls=Item, **kw) -> Item:
        meta = dict(meta)
        value = {k[2:]: v for k, v in meta.items() if k.startswith("v:")}
        n = sum(k.startswith("lg_val.") for k in meta)
        if n:
            value.update(loads_json("".join(meta[f"lg_val.{j}"] for j in range(n))))
        if "lg_text" in meta:
            value[meta["lg_text"]] = text
        ns = tuple(meta["lg_ns"].split("."))
        return cls(namespace=ns, key=meta["lg_key"], value=value, created_at=datetime.fromisoformat(meta["lg_created"]),
                   updated_at=datetime.fromisoformat(meta["lg_updated"]), **kw)

    # -- reads ------------------------------------------------------------------------------------
    def _turns(self, bank: str, where) -> list:
        """The newest turn of each item of ``bank`` passing ``where``, in the order they were put."""
        from ..memory.scope import passes

        try:
            turns = self.memory.turns(bank)
        except UnknownBank:
            return []
        newest: dict[str, Any] = {}
        for t in turns:
            if passes(where, t):
                newest.pop(t.metadata["lg_id"], None)
                newest[t.metadata["lg_id"]] = t
        return list(newest.values())

    def _versions(self, bank: str, ns: tuple, key: str) -> list:
        """Every turn of the item (more than one only after a crash between a put's two writes)."""
        try:
            turns = self.memory.turns(bank)
        except UnknownBank:
            return []
        iid = item_id(ns, key)
        return [t for t in turns if t.metadata and t.metadata.get("lg_id") == iid]

    def _get(self, op: GetOp) -> Item | None:
        ns = check_namespace(op.namespace)
        found = self._versions(self._bank(ns), ns, str(op.key))
        return self._item(found[-1].metadata, found[-1].text) if found else None

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = check_namespace(op.namespace_prefix, "namespace_prefix", empty=True, wild=True)
        if not isinstance(op.limit, int) or not isinstance(op.offset, int) or op.limit < 0 or op.offset < 0:
            raise InputError(f"limit / offset: expected non-negative integers, got {op.limit!r} / {op.offset!r}")
        where = self._where(self._ns_where(prefix) + self._filter(op.filter))
        banks = self._banks(prefix)
        if op.query is None:
            turns = [t for b in banks for t in self._turns(b, where)]
            return [self._item(t.metadata, t.text, SearchItem) for t in turns[op.offset:op.offset + op.limit]]
        if not isinstance(op.query, str) or not op.query.strip():
            raise InputError("query: expected a non-empty string")
        if not banks or op.limit == 0:
            return []
        budget = _run_config().get("trawmem_token_budget", self.token_budget)
        try:
            got = self.memory.select_many([(b, op.query) for b in banks], where=where, token_budget=budget,
                                          budget=op.offset + op.limit)
        except UnknownBank:  # deleted meanwhile
            return []
        ranked = []
        for rank in range(max((len(w.picks) for w in got), default=0)):  # banks interleaved rank by rank
            for w in got:
                if rank < len(w.picks):
                    unit = next(u for u in w.units if u.id == w.picks[rank])
                    ranked.append(self._item(unit.metadata, unit.text, SearchItem))
        return ranked[op.offset:op.offset + op.limit]

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        parts, prefix = [], ()
        for c in op.match_conditions or ():
            path = check_namespace(tuple(c.path), f"{c.match_type}", empty=True, wild=True)
            if c.match_type not in ("prefix", "suffix"):
                raise InputError(f"match_type: expected 'prefix' or 'suffix', got {c.match_type!r}")
            parts += self._ns_where(path, c.match_type == "suffix")
            prefix = path if c.match_type == "prefix" else prefix
        depth = op.max_depth
        if depth is not None and (not isinstance(depth, int) or depth < 1):
            raise InputError(f"max_depth: expected a positive integer, got {depth!r}")
        where = self._where(parts)
        found = {tuple(t.metadata["lg_ns"].split("."))[:depth] for b in self._banks(prefix)
                 for t in self._turns(b, where)}
        return sorted(found)[op.offset:op.offset + op.limit]

    # -- the batch --------------------------------------------------------------------------------
    def batch(self, ops: Iterable) -> list:
        """Run ``ops`` (``GetOp``, ``SearchOp``, ``ListNamespacesOp``, ``PutOp``): reads first, on the
        store as it was; then the puts (the last of a key wins), checked whole before any write."""
        ops = list(ops)
        results: list = []
        puts: dict[tuple, tuple[int, PutOp]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list(op))
            elif isinstance(op, PutOp):
                puts[(check_namespace(op.namespace), op.key)] = (i, op)
                results.append(None)
            else:
                raise InputError(f"ops[{i}]: unknown operation {type(op).__name__}")
        if puts:
            self._write([op for _, op in sorted(puts.values(), key=lambda p: p[0])])
        return results

    def _write(self, ops: list[PutOp]) -> None:
        adds: dict[str, list[dict]] = {}
        drops: dict[str, list[str]] = {}
        for i, op in enumerate(ops):
            bank = self._bank(op.namespace)
            old = self._versions(bank, op.namespace, op.key) if isinstance(op.key, str) else []
            if op.value is not None:
                _, msg = self._record(op, self._item(old[-1].metadata, old[-1].text) if old else None)
                adds.setdefault(bank, []).append(msg)
            drops.setdefault(bank, []).extend(t.turn_id for t in old)
        for bank, msgs in adds.items():  # the new versions first: a crash before the forgets loses nothing
            self.memory.add(bank, messages=msgs, speakers={"user": self.speaker}, atomic=True)
        for bank, ids in drops.items():
            if ids:
                self.memory.forget(bank, ids)

    async def abatch(self, ops: Iterable) -> list:
        """:meth:`batch` on a worker thread (the event loop runs on)."""
        ops = list(ops)
        return await asyncio.get_running_loop().run_in_executor(None, self.batch, ops)
