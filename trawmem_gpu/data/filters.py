"""The filter language of ``where=``: one parser (:func:`parse_filter`), one evaluator
(:meth:`Filter.mask` over :class:`MetaColumns`), for every door (``Memory.select``, the HTTP select
body, MCP ``recall``, ``trawmem score`` question items, ``trawmem query --where``, serve keys).

A filter is a JSON object over turn metadata (:mod:`trawmem_gpu.data.metadata`)::

    {"user_id": "u1"}                                  eq, the shorthand
    {"user_id": {"in": ["u1", "u2"]}, "importance": {"gte": 3}}
    {"or": [{"agent_id": "planner"}, {"not": {"run_id": {"exists": true}}}]}
    {"created": {"gte": "2024-03-01", "lt": "2024-04-01T00:00:00Z"}}

* **conditions**: ``{KEY: VALUE}`` (eq) or ``{KEY: {OP: OPERAND, ...}}`` with OP among ``eq``,
  ``ne``, ``in``, ``nin``, ``gt``, ``gte``, ``lt``, ``lte``, ``exists``; several operators on one
  key, and several keys in one object, must all hold (and);
* **logic**: ``{"and": [F, ...]}``, ``{"or": [F, ...]}`` (non-empty lists), ``{"not": F}``;
  ``AND`` / ``OR`` / ``NOT`` are accepted too (mem0 writes them so). ``{}`` holds for every turn;
* **operands**: ``eq`` / ``ne``: a string, number, boolean or ISO date (never null: use
  ``exists``); ``in`` / ``nin``: a non-empty list of those (at most :data:`MAX_IN_VALUES`);
  ``gt`` / ``gte`` / ``lt`` / ``lte``: a number or an ISO date; ``exists``: a boolean.

**What compares with what.** Every value has one kind: string, number, boolean or date (a string
in ISO 8601 form is a date, read as UTC; a date alone is its midnight). Numbers compare as numbers
(``1`` equals ``1.0``), dates as times (``"2024-03-01"`` equals ``"2024-03-01T00:00:00Z"``),
strings exactly (case and all), booleans as booleans. Values of different kinds never compare:
``eq`` and the ranges are false (``{"n": {"gt": 2}}`` does not hold for ``"n": "3"``), and ``true``
is not ``1``. A turn without the key fails ``eq``, ``in`` and the ranges. ``ne`` is exactly ``not
eq`` and ``nin`` exactly ``not in``: they hold for a turn that lacks the key (to require it, add
``{"exists": true}``). ``gt`` over strings is an error, not a lexicographic order.

Errors name the path inside the filter (``where.or[1].importance.gte: expected a number or an ISO
8601 date, got 'high'``). Bounds, each refused with an ``InputError`` naming it: at most
:data:`MAX_FILTER_BYTES` bytes as compact JSON (measured first, by a walk that stops at the bound,
so a huge filter costs no more than one at the bound), :data:`MAX_NODES` nodes (every filter
object, ``{}`` and the items of ``and`` / ``or`` included, and every condition),
:data:`MAX_CONDITIONS` conditions and :data:`MAX_DEPTH` levels. Levels are those of the canonical
form (:attr:`Filter.json`): an object of several conditions is the ``and`` of them, one level more.

**Canonical form.** :attr:`Filter.json` writes every node as one single-key object (``{KEY:
{OP: OPERAND}}``, ``{"and": [...]}``, ``{"or": [...]}``, ``{"not": F}``) and an empty filter as
``{}``; it parses back to the same filter (``parse_filter(f.json) == f``), which is how a filter
crosses a pickle (an engine process, a cache key).

:class:`MetaColumns` holds a bank's metadata as columns (per key: kind, number, date, string
code), built once per key on first use; :meth:`Filter.mask` is vectorized over them, so a filter
costs a few NumPy passes over the bank's units. :meth:`Filter.matches` is the same evaluator over
one turn's metadata.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date as _date, datetime
from typing import Sequence

import numpy as np

from ..errors import InputError
from .metadata import check_key, check_value, date_text, iso_date, micros

OPS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists")
"""The operators of a condition."""
LOGIC = ("and", "or", "not")
MAX_DEPTH = 16
"""Most nested levels (objects inside ``and`` / ``or`` / ``not``, counted on the canonical form:
an object of several conditions is one level more)."""
MAX_CONDITIONS = 256
"""Most conditions (key-operator pairs) in one filter."""
MAX_NODES = 1024
"""Most nodes in one filter: every filter object (``{}`` and each item of ``and`` / ``or``
included) and every condition counts one."""
MAX_FILTER_BYTES = 65536
"""Largest filter, in bytes of its compact JSON (UTF-8; a date operand counts as its ISO text)."""
MAX_IN_VALUES = 1024
"""Most values in one ``in`` / ``nin`` list."""

STR, NUM, BOOL, DATE = 1, 2, 3, 4
"""Value kinds (0: absent)."""
_RANGE = {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}


def _kind_of(v) -> tuple[int, object]:
    """``(kind, comparable value)`` of a checked metadata value or operand."""
    if isinstance(v, bool):
        return BOOL, v
    if isinstance(v, (int, float)):
        return NUM, float(v)
    d = iso_date(v)
    return (DATE, micros(d)) if d is not None else (STR, v)


@dataclass(frozen=True)
class Cond:
    """One condition: ``key`` ``op`` ``operand`` (``operand``: the JSON operand; ``parsed``:
    ``(kind, value)`` or, for ``in`` / ``nin``, a tuple of them; a boolean for ``exists``)."""

    key: str
    op: str
    operand: object
    parsed: object


@dataclass(frozen=True)
class Logic:
    """``and`` / ``or`` over ``items``, or ``not`` of its one item."""

    op: str
    items: tuple


class _Parser:
    """One parse, counting nodes and conditions; ``bounded=False`` (a filter this package made
    itself, e.g. :func:`both` of two parsed filters, crossing a pickle) skips the size bounds."""

    def __init__(self, bounded: bool = True):
        self.conditions = self.nodes = 0
        self.bounded = bounded

    def node(self, f, path: str, depth: int):
        self.nodes += 1
        if self.bounded and self.nodes > MAX_NODES:
            raise InputError(f"{path}: the filter holds more than {MAX_NODES} nodes (filter objects and conditions)")
        if self.bounded and depth > MAX_DEPTH:
            raise InputError(f"{path}: the filter nests deeper than {MAX_DEPTH} levels")
        if not isinstance(f, dict):
            raise InputError(f"{path}: expected a filter object, got {_what(f)}")
        inner = depth + 1 if _n_items(f) > 1 else depth  # several items: an and, they one level below
        if self.bounded and inner > MAX_DEPTH:
            raise InputError(f"{path}: the filter nests deeper than {MAX_DEPTH} levels (an object of several "
                             "conditions is the and of them, one level more)")
        items = []
        for k, v in f.items():
            if _is_logic(k):
                items.append(self.logic(k.lower(), v, f"{path}.{k}", inner))
            else:
                check_key(k, None, path)
                items += self.conditions_of(k, v, f"{path}.{k}")
        return items[0] if len(items) == 1 else Logic("and", tuple(items))

    def logic(self, op: str, v, path: str, depth: int):
        if op == "not":
            return Logic("not", (self.node(v, path, depth + 1),))
        if not isinstance(v, list) or not v:
            raise InputError(f"{path}: expected a non-empty list of filter objects, got {_what(v)}")
        return Logic(op, tuple(self.node(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)))

    def conditions_of(self, key: str, v, path: str) -> list:
        if not isinstance(v, dict):
            if isinstance(v, (list, tuple)):
                raise InputError(f"{path}: a list; to match any of several values write {{\"in\": [...]}}")
            return [self.cond(key, "eq", v, path)]
        if not v:
            raise InputError(f"{path}: an empty operator object (give one of {', '.join(OPS)})")
        out = []
        for op, x in v.items():
            if op not in OPS:
                raise InputError(f"{path}: unknown operator {str(op)[:40]!r} (the operators are {', '.join(OPS)})")
            out.append(self.cond(key, op, x, f"{path}.{op}"))
        return out

    def cond(self, key: str, op: str, x, path: str) -> Cond:
        self.conditions += 1
        if self.bounded and self.conditions > MAX_CONDITIONS:
            raise InputError(f"{path}: the filter holds more than {MAX_CONDITIONS} conditions")
        if op == "exists":
            if not isinstance(x, bool):
                raise InputError(f"{path}: expected true or false, got {_what(x)}")
            return Cond(key, op, x, x)
        if op in ("in", "nin"):
            if not isinstance(x, (list, tuple)) or not x:
                raise InputError(f"{path}: expected a non-empty list of values, got {_what(x)}")
            if len(x) > MAX_IN_VALUES:
                raise InputError(f"{path}: {len(x)} values; the limit is {MAX_IN_VALUES}")
            vals = [_operand(y, f"{path}[{i}]") for i, y in enumerate(x)]
            return Cond(key, op, vals, tuple(_kind_of(y) for y in vals))
        val = _operand(x, path)
        kind, cmp = _kind_of(val)
        if op in _RANGE and kind not in (NUM, DATE):
            raise InputError(f"{path}: expected a number or an ISO 8601 date, got {_what(x)} ({op} compares "
                             "numbers and dates only)")
        return Cond(key, op, val, (kind, cmp))


def _is_logic(k) -> bool:
    """Whether key ``k`` is a logic operator (``and``, ``or``, ``not``, or the same in capitals)."""
    return isinstance(k, str) and k.lower() in LOGIC and k in (k.lower(), k.upper())


def _n_items(f: dict) -> int:
    """How many nodes object ``f`` holds side by side: one per logic key, one per operator of a
    condition key (one for an ``eq`` shorthand)."""
    n = 0
    for k, v in f.items():
        n += len(v) if isinstance(v, dict) and not _is_logic(k) else 1
        if n > 1:
            return n
    return n


def _size_over(f, limit: int) -> bool:
    """Whether ``f`` as compact JSON is over ``limit`` bytes: an iterative walk (no recursion,
    whatever the nesting) that stops as soon as it has counted past ``limit``."""
    total, stack = 0, [f]
    while stack:
        x = stack.pop()
        if isinstance(x, (dict, list, tuple)) and len(x) > limit:
            return True
        if isinstance(x, dict):
            total += 1 + max(1, 2 * len(x))  # braces, a colon and a comma (or the closing brace) per key
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            total += 1 + max(1, len(x))
            stack.extend(x)
        elif isinstance(x, str):
            total += 2 + (len(x) if len(x) > limit else len(x.encode("utf-8", "surrogatepass")))
        elif isinstance(x, bool) or x is None:
            total += 5 if x is False else 4
        elif isinstance(x, int):
            total += len(repr(x)) if x.bit_length() < 64 else x.bit_length() * 3 // 10
        elif isinstance(x, (datetime, _date)):
            total += 2 + len(x.isoformat())
        else:
            total += len(repr(x)) if isinstance(x, float) else 1
        if total > limit or len(stack) > limit:
            return True
    return False


def _operand(x, path: str):
    if x is None:
        raise InputError(f"{path}: null is not a value (use {{\"exists\": false}} for a missing key)")
    if isinstance(x, (dict, list, tuple)):
        raise InputError(f"{path}: expected a string, number, boolean or ISO date, got {_what(x)}")
    if isinstance(x, (datetime, _date)):
        return date_text(x, path, "value")
    return check_value(x, None, path)


def _what(x) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, (int, float)):
        return f"the number {x!r}"
    if isinstance(x, str):
        return repr(x[:40] + ("..." if len(x) > 40 else ""))
    if isinstance(x, (list, tuple, dict)) and not x:
        return "an empty " + ("object" if isinstance(x, dict) else "list")
    return {"dict": "an object", "list": "a list", "tuple": "a list"}.get(type(x).__name__, type(x).__name__)


def _to_json(n):
    if isinstance(n, Cond):
        return {n.key: {n.op: list(n.operand) if isinstance(n.operand, (list, tuple)) else n.operand}}
    if not n.items:  # the empty and: {} (holds for every turn), which parses back to it
        return {}
    if n.op == "not":
        return {"not": _to_json(n.items[0])}
    return {n.op: [_to_json(x) for x in n.items]}


class Filter:
    """A parsed filter (:func:`parse_filter`): :meth:`mask` over a bank's :class:`MetaColumns`,
    :meth:`matches` over one turn's metadata, :attr:`json` its canonical JSON form and :attr:`key`
    that form as text (equal filters, equal keys: masks are cached by it). Picklable."""

    __slots__ = ("root", "json", "key")

    def __init__(self, root):
        self.root = root
        self.json = _to_json(root)
        self.key = json.dumps(self.json, ensure_ascii=False, sort_keys=False, separators=(",", ":"))

    def __eq__(self, other) -> bool:
        return isinstance(other, Filter) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Filter({self.key})"

    def __getstate__(self):
        return self.json

    def __setstate__(self, state):
        # the state is a filter this package parsed (or combined with both(): past the bounds)
        f = Filter(_Parser(bounded=False).node(state, "where", 1))
        self.root, self.json, self.key = f.root, f.json, f.key

    def mask(self, cols: "MetaColumns") -> np.ndarray:
        """``[n]`` bool: which units of ``cols`` pass (the one evaluator)."""
        return _eval(self.root, cols)

    def matches(self, metadata: dict | None) -> bool:
        """Whether one turn with ``metadata`` passes."""
        return bool(self.mask(MetaColumns([metadata]))[0])


def parse_filter(f, name: str = "where") -> Filter | None:
    """``f`` (a JSON-able object, see the module docstring) as a :class:`Filter`; None for None or
    ``{}`` (every turn passes). A :class:`Filter` is returned as is. An ``InputError`` names the
    path inside the filter (``name`` first); a filter over :data:`MAX_FILTER_BYTES` is refused
    before it is walked."""
    if f is None or isinstance(f, Filter):
        return f
    if isinstance(f, dict) and not f:
        return None
    if _size_over(f, MAX_FILTER_BYTES):
        raise InputError(f"{name}: the filter is over {MAX_FILTER_BYTES} bytes as JSON (the limit)")
    return Filter(_Parser().node(f, name, 1))


def both(a: Filter | None, b: Filter | None) -> Filter | None:
    """``a`` and ``b`` (None: no filter): a key's bound filter with the caller's, so the caller can
    only narrow it."""
    if a is None or b is None:
        return a if b is None else b
    if a == b:
        return a
    return Filter(Logic("and", (a.root, b.root)))


# ----------------------------------------------------------------------------------------------
# the evaluator
# ----------------------------------------------------------------------------------------------
class Column:
    """One key's values over ``n`` units: ``kind`` (0 where absent), numbers, dates (microseconds),
    booleans and string codes (``codes`` into ``vocab``)."""

    __slots__ = ("kind", "num", "date", "boolv", "codes", "vocab")

    def __init__(self, values: list):
        n = len(values)
        self.kind = np.zeros(n, dtype=np.int8)
        self.num = np.zeros(n)
        self.date = np.zeros(n, dtype=np.int64)
        self.boolv = np.zeros(n, dtype=bool)
        self.codes = np.full(n, -1, dtype=np.int64)
        self.vocab: dict[str, int] = {}
        for i, v in enumerate(values):
            if v is _ABSENT:
                continue
            k, c = _kind_of(v)
            self.kind[i] = k
            if k == NUM:
                self.num[i] = c
            elif k == DATE:
                self.date[i] = c
            elif k == BOOL:
                self.boolv[i] = c
            else:
                self.codes[i] = self.vocab.setdefault(c, len(self.vocab))

    def eq(self, kind: int, v) -> np.ndarray:
        if kind == STR:
            code = self.vocab.get(v)
            return self.codes == code if code is not None else np.zeros(len(self.kind), dtype=bool)
        same = self.kind == kind
        if kind == NUM:
            return same & (self.num == v)
        if kind == DATE:
            return same & (self.date == v)
        return same & (self.boolv == v)


_ABSENT = object()


class MetaColumns:
    """The metadata of ``n`` units (one dict or None each) as columns, one :class:`Column` per
    key, built on first use (thread-safe: building twice gives the same column)."""

    def __init__(self, metas: Sequence[dict | None]):
        self.metas = list(metas)
        self.n = len(self.metas)
        self._cols: dict[str, Column] = {}

    def column(self, key: str) -> Column:
        c = self._cols.get(key)
        if c is None:
            c = self._cols[key] = Column([(m or {}).get(key, _ABSENT) for m in self.metas])
        return c


def _leaf(c: Cond, cols: MetaColumns) -> np.ndarray:
    col = cols.column(c.key)
    if c.op == "exists":
        present = col.kind > 0
        return present if c.parsed else ~present
    if c.op in ("in", "nin"):
        m = np.zeros(cols.n, dtype=bool)
        strs = [v for k, v in c.parsed if k == STR]
        if strs:
            codes = [col.vocab[s] for s in strs if s in col.vocab]
            if codes:
                m |= np.isin(col.codes, codes)
        for k, v in c.parsed:
            if k != STR:
                m |= col.eq(k, v)
        return m if c.op == "in" else ~m
    kind, v = c.parsed
    if c.op in ("eq", "ne"):
        m = col.eq(kind, v)
        return m if c.op == "eq" else ~m
    vals = col.num if kind == NUM else col.date
    return (col.kind == kind) & _RANGE[c.op](vals, v)


def _eval(n, cols: MetaColumns) -> np.ndarray:
    if isinstance(n, Cond):
        return _leaf(n, cols)
    if n.op == "not":
        return ~_eval(n.items[0], cols)
    out = None
    for x in n.items:
        m = _eval(x, cols)
        out = m if out is None else (out & m if n.op == "and" else out | m)
    return out if out is not None else np.ones(cols.n, dtype=bool)
