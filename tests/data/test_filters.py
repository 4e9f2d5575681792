"""The filter language of ``where=`` (``data.filters``): the operators, what compares with what,
errors naming the path inside the filter, and the one evaluator against a plain Python statement
of the rules on random metadata and random filters."""
from __future__ import annotations

import json
import pickle
import random
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pytest

from trawmem_gpu.data.filters import (MAX_CONDITIONS, MAX_DEPTH, MAX_FILTER_BYTES, MAX_NODES, MetaColumns, both,
                                      parse_filter)
from trawmem_gpu.errors import InputError

METAS = [
    {"user_id": "u1", "n": 3, "ok": True, "day": "2024-03-01"},
    {"user_id": "u1", "n": 3.0, "ok": False, "day": "2024-03-01T00:00:00Z"},
    {"user_id": "u2", "n": "3", "day": "2024-03-02T09:30:00+02:00"},
    {"user_id": "U1", "n": 10, "ok": 1},
    None,
    {"agent_id": "planner", "day": "not a date"},
]


def _mask(f) -> list[bool]:
    return parse_filter(f).mask(MetaColumns(METAS)).tolist()


@pytest.mark.parametrize("f,want", [
    ({"user_id": "u1"}, [1, 1, 0, 0, 0, 0]),                        # eq shorthand: exact, case and all
    ({"user_id": {"ne": "u1"}}, [0, 0, 1, 1, 1, 1]),                # ne = not eq: holds where the key is missing
    ({"user_id": {"in": ["u1", "u2"]}}, [1, 1, 1, 0, 0, 0]),
    ({"user_id": {"nin": ["u1", "u2"]}}, [0, 0, 0, 1, 1, 1]),
    ({"n": 3}, [1, 1, 0, 0, 0, 0]),                                 # 3 == 3.0; "3" is a string, not a number
    ({"n": {"gt": 2, "lte": 10}}, [1, 1, 0, 1, 0, 0]),              # several operators: all hold
    ({"n": {"lt": 3}}, [0, 0, 0, 0, 0, 0]),
    ({"ok": True}, [1, 0, 0, 0, 0, 0]),                             # true is not 1
    ({"ok": 1}, [0, 0, 0, 1, 0, 0]),
    ({"day": "2024-03-01"}, [1, 1, 0, 0, 0, 0]),                    # dates compare as times (Z: the same midnight)
    ({"day": {"gte": "2024-03-02T07:00:00"}}, [0, 0, 1, 0, 0, 0]),  # 09:30+02:00 is 07:30 UTC
    ({"day": {"gt": "2024-03-02T07:30:00Z"}}, [0, 0, 0, 0, 0, 0]),
    ({"day": {"lt": datetime(2024, 3, 2, 9, tzinfo=timezone(timedelta(hours=1)))}}, [1, 1, 1, 0, 0, 0]),  # 08:00 UTC
    ({"day": {"lt": date(2024, 3, 2)}}, [1, 1, 0, 0, 0, 0]),
    ({"day": "not a date"}, [0, 0, 0, 0, 0, 1]),                    # a string that is no date is a string
    ({"day": {"exists": True}}, [1, 1, 1, 0, 0, 1]),
    ({"day": {"exists": False}}, [0, 0, 0, 1, 1, 0]),
    ({"or": [{"agent_id": "planner"}, {"n": {"gte": 10}}]}, [0, 0, 0, 1, 0, 1]),
    ({"not": {"user_id": {"exists": True}}}, [0, 0, 0, 0, 1, 1]),
    ({"AND": [{"user_id": "u1"}, {"NOT": {"ok": True}}]}, [0, 1, 0, 0, 0, 0]),  # mem0's spelling
    ({"user_id": "u1", "ok": False}, [0, 1, 0, 0, 0, 0]),           # several keys: and
])
def test_operators_and_kinds(f, want):
    assert _mask(f) == [bool(x) for x in want]


def test_no_filter_and_the_empty_filter_pass_everything():
    assert parse_filter(None) is None and parse_filter({}) is None
    assert both(None, None) is None
    f = parse_filter({"user_id": "u1"})
    assert both(f, None) is f and both(None, f) is f and both(f, f) is f


def test_both_narrows_and_is_what_the_two_say():
    key = parse_filter({"user_id": "u1"})
    wide = parse_filter({"or": [{"user_id": "u2"}, {"n": {"exists": True}}]})
    got = both(key, wide).mask(MetaColumns(METAS))
    np.testing.assert_array_equal(got, key.mask(MetaColumns(METAS)) & wide.mask(MetaColumns(METAS)))
    assert not both(key, parse_filter({"not": {"user_id": "u1"}})).mask(MetaColumns(METAS)).any()


def test_canonical_form_pickles_and_compares():
    f = parse_filter({"day": {"gte": date(2024, 3, 1)}, "user_id": "u1"})
    assert f.json == {"and": [{"day": {"gte": "2024-03-01"}}, {"user_id": {"eq": "u1"}}]}
    g = pickle.loads(pickle.dumps(f))
    assert g == f and hash(g) == hash(f) and g.key == f.key
    assert parse_filter(f.json) == f
    assert f.matches({"user_id": "u1", "day": "2024-05-01"}) and not f.matches(None)


@pytest.mark.parametrize("f,path,why", [
    ([{"user_id": "u1"}], "where", "expected a filter object"),
    ({"user_id": None}, "where.user_id", "null is not a value"),
    ({"user_id": ["u1"]}, "where.user_id", '{"in": [...]}'),
    ({"user_id": {}}, "where.user_id", "empty operator object"),
    ({"user_id": {"equals": "u1"}}, "where.user_id", "unknown operator 'equals'"),
    ({"n": {"gt": "high"}}, "where.n.gt", "a number or an ISO 8601 date"),
    ({"n": {"lte": True}}, "where.n.lte", "a number or an ISO 8601 date"),
    ({"n": {"in": []}}, "where.n.in", "non-empty list"),
    ({"n": {"in": [1, {"a": 1}]}}, "where.n.in[1]", "expected a string, number, boolean or ISO date"),
    ({"n": {"exists": "yes"}}, "where.n.exists", "true or false"),
    ({"n": float("nan")}, "where.n", "finite"),
    ({"n": 2 ** 60}, "where.n", "2**53"),
    ({"or": []}, "where.or", "non-empty list"),
    ({"or": [{"a": 1}, "b"]}, "where.or[1]", "expected a filter object"),
    ({"not": [{"a": 1}]}, "where.not", "expected a filter object"),
    ({"and": [{"or": [{"user id": 1}]}]}, "where.and[0].or[0]", "not a metadata key"),
    ({"user_id": "x" * 2000}, "where.user_id", "the limit is 1024"),
])
def test_errors_name_the_path_inside_the_filter(f, path, why):
    with pytest.raises(InputError) as e:
        parse_filter(f)
    msg = str(e.value)
    assert msg.startswith(path + ":") and why in msg, msg
    assert "x" * 100 not in msg  # a long value is never echoed


def test_bounds():
    deep = {"user_id": "u1"}
    for _ in range(MAX_DEPTH):
        deep = {"not": deep}
    with pytest.raises(InputError, match="deeper than"):
        parse_filter(deep)
    with pytest.raises(InputError, match="more than"):
        parse_filter({"or": [{"n": i} for i in range(MAX_CONDITIONS + 1)]})
    with pytest.raises(InputError, match=r"^requests\[2\]\.where\.n:"):
        parse_filter({"n": None}, "requests[2].where")


# ----------------------------------------------------------------------------------------------
# the evaluator against a plain statement of the rules
# ----------------------------------------------------------------------------------------------
def _when(v):
    """The time a value names when it is an ISO date (the rule, restated), else None."""
    if not isinstance(v, str) or len(v) < 10 or v[4] != "-" or v[7] != "-":
        return None
    try:
        d = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None
    return d.astimezone(timezone.utc).replace(tzinfo=None) if d.tzinfo else d


def _norm(v):
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", float(v))
    d = _when(v)
    return ("d", d) if d is not None else ("s", v)


def _holds(f, m) -> bool:
    m = m or {}
    out = True
    for k, v in f.items():
        if k in ("and", "or", "AND", "OR"):
            r = [_holds(x, m) for x in v]
            out &= all(r) if k.lower() == "and" else any(r)
        elif k in ("not", "NOT"):
            out &= not _holds(v, m)
        else:
            ops = v if isinstance(v, dict) else {"eq": v}
            for op, x in ops.items():
                have = k in m
                a = _norm(m[k]) if have else None
                if op == "exists":
                    out &= have == x
                elif op in ("eq", "ne"):
                    out &= (have and a == _norm(x)) == (op == "eq")
                elif op in ("in", "nin"):
                    out &= (have and a in [_norm(y) for y in x]) == (op == "in")
                else:
                    b = _norm(x)
                    ok = have and a[0] == b[0] and {"gt": a[1] > b[1], "gte": a[1] >= b[1], "lt": a[1] < b[1],
                                                    "lte": a[1] <= b[1]}[op]
                    out &= bool(ok)
    return bool(out)


VALUES = ["u1", "u2", "2024-03-01", "2024-03-01T12:00:00Z", 1, 2.5, 3, True, False, "x"]


def _rand_filter(rng: random.Random, depth: int = 0) -> dict:
    if depth < 2 and rng.random() < 0.35:
        op = rng.choice(["and", "or", "not"])
        if op == "not":
            return {"not": _rand_filter(rng, depth + 1)}
        return {op: [_rand_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    key = rng.choice(["a", "b", "c"])
    op = rng.choice(["eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists"])
    if op == "exists":
        return {key: {"exists": rng.random() < 0.5}}
    if op in ("in", "nin"):
        return {key: {op: rng.sample(VALUES, rng.randint(1, 4))}}
    if op in ("gt", "gte", "lt", "lte"):
        return {key: {op: rng.choice([1, 2.5, 3, "2024-03-01", "2024-03-01T12:00:00Z"])}}
    return {key: {op: rng.choice(VALUES)}}


def test_the_evaluator_states_the_rules():
    rng = random.Random(5)
    metas = [None] + [{k: rng.choice(VALUES) for k in "abc" if rng.random() < 0.7} for _ in range(300)]
    cols = MetaColumns(metas)
    for _ in range(400):
        f = _rand_filter(rng)
        got = parse_filter(f).mask(cols).tolist()
        want = [_holds(f, m) for m in metas]
        assert got == want, f


# ----------------------------------------------------------------------------------------------
# every filter that parses survives the trip to an engine process (issue 42 item 1)
# ----------------------------------------------------------------------------------------------
def _wild_filter(rng: random.Random, depth: int = 1) -> dict:
    """A random filter object of any shape the language has: ``{}``, several keys side by side,
    logic beside conditions, capitals, several operators on one key, date objects, nesting up to
    (and past) the bound."""
    f = {}
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        r = rng.random()
        if r < 0.4 and depth < MAX_DEPTH + 1:
            op = rng.choice(["and", "or", "not", "AND", "OR", "NOT"])
            sub = [_wild_filter(rng, depth + 1) for _ in range(rng.randint(1, 3 if depth < 4 else 1))]
            f[op] = sub[0] if op.lower() == "not" else sub
        else:
            key = rng.choice(["a", "b", "c", "d"])
            ops = rng.sample(["eq", "ne", "in", "nin", "gt", "lte", "exists"], rng.randint(1, 2))
            val = {}
            for op in ops:
                if op == "exists":
                    val[op] = rng.random() < 0.5
                elif op in ("in", "nin"):
                    val[op] = rng.sample(VALUES, rng.randint(1, 3))
                elif op in ("gt", "lte"):
                    val[op] = rng.choice([1, 2.5, "2024-03-01", date(2024, 3, 1), datetime(2024, 3, 1, 12)])
                else:
                    val[op] = rng.choice(VALUES)
            f[key] = val if len(val) > 1 or rng.random() < 0.5 or "eq" not in val else val["eq"]
    return f


def _plain(f):
    """``f`` with date objects as the ISO text they stand for (the reference reads text)."""
    if isinstance(f, dict):
        return {k: _plain(v) for k, v in f.items()}
    if isinstance(f, list):
        return [_plain(x) for x in f]
    if isinstance(f, datetime):
        return f.isoformat()
    return f.isoformat() if isinstance(f, date) else f


def test_every_filter_that_parses_round_trips_through_json_and_pickle():
    """The canonical JSON of every parsed filter parses back to it (``{"not": {}}`` once wrote
    ``{"not": {"and": []}}``, which did not parse: unpickling in the engine process raised and
    the ``--http-workers`` server stopped), pickles to it, and the mask stays the rule's."""
    rng = random.Random(42)
    metas = [None] + [{k: rng.choice(VALUES) for k in ("a", "b", "c", "d") if rng.random() < 0.7}
                      for _ in range(60)]
    cols, parsed, refused = MetaColumns(metas), 0, 0
    for _ in range(2000):
        f = _wild_filter(rng)
        try:
            g = parse_filter(f)
        except InputError as e:
            assert "deeper than" in str(e), (f, e)  # the generator nests past the bound on purpose
            refused += 1
            continue
        if g is None:
            assert f == {}
            continue
        parsed += 1
        plain = _plain(f)
        want = [_holds(plain, m) for m in metas]
        for back in (parse_filter(g.json), pickle.loads(pickle.dumps(g)), parse_filter(json.loads(json.dumps(g.json)))):
            assert back == g and back.key == g.key, (f, g)
            assert back.mask(cols).tolist() == want, f
    assert parsed > 1200 and refused > 0
    for f, want in (({"not": {}}, [False] * 2), ({"and": [{}]}, [True] * 2), ({"or": [{"not": {}}, {}]}, [True] * 2),
                    ({"NOT": {"and": [{}, {"not": {}}]}}, [True] * 2)):
        g = pickle.loads(pickle.dumps(parse_filter(f)))
        assert g.json == f if "NOT" not in f else g.json == {"not": f["NOT"]}
        assert g.mask(MetaColumns([{"a": 1}, None])).tolist() == want, f


def test_a_combined_filter_past_the_bounds_still_pickles():
    """A key's filter and the request's, each within the bounds, together past them (depth and
    conditions): the combination crosses a pickle whole."""
    deep = {"a": 1}
    for _ in range(MAX_DEPTH - 1):
        deep = {"not": deep}
    many = {"or": [{"n": i} for i in range(MAX_CONDITIONS)]}
    for a, b in ((deep, {"not": {"not": {"a": {"exists": False}}}}), (many, {"not": many}), (deep, many)):
        assert parse_filter(a).json != parse_filter(b).json
        both_ = both(parse_filter(a), parse_filter(b))
        back = pickle.loads(pickle.dumps(both_))
        assert back == both_
        metas = [{"a": 1, "n": 3}, {"n": 300}, None]
        assert back.mask(MetaColumns(metas)).tolist() == both_.mask(MetaColumns(metas)).tolist()


def test_levels_are_the_canonical_forms():
    """An object of several conditions is an and, one level more: at the last level it is refused
    (its canonical form would be past the bound), one level up it parses and round-trips."""
    def nest(f, n):
        for _ in range(n):
            f = {"not": f}
        return f

    with pytest.raises(InputError, match="deeper than"):
        parse_filter(nest({"a": 1, "b": 2}, MAX_DEPTH - 1))
    with pytest.raises(InputError, match="deeper than"):
        parse_filter(nest({"a": {"gt": 1, "lt": 5}}, MAX_DEPTH - 1))
    for f in (nest({"a": 1, "b": 2}, MAX_DEPTH - 2), nest({"a": 1}, MAX_DEPTH - 1)):
        g = parse_filter(f)
        assert parse_filter(g.json) == g == pickle.loads(pickle.dumps(g))


def test_size_bounds_count_every_node_and_every_byte():
    """``{"and": [{}, {}, ...]}`` of 4 MB once parsed for 21 s (empty objects were not counted):
    refused by its size before the walk, and by its node count at a smaller size; filters at the
    bounds parse."""
    with pytest.raises(InputError, match=rf"^where: the filter is over {MAX_FILTER_BYTES} bytes"):
        parse_filter({"and": [{}] * 1_000_000})
    with pytest.raises(InputError, match=rf"more than {MAX_NODES} nodes"):
        parse_filter({"and": [{}] * MAX_NODES})
    assert parse_filter({"and": [{}] * (MAX_NODES - 1)}).mask(MetaColumns([None])).tolist() == [True]
    with pytest.raises(InputError, match="over 65536 bytes"):  # a long in-list of long strings
        parse_filter({"or": [{"u": {"in": ["x" * 1000] * 70}}]})
    vals = [f"{i:01000d}" for i in range(66)]  # a filter of exactly MAX_FILTER_BYTES as compact JSON
    vals[-1] = vals[-1][:1000 - (len(json.dumps({"u": {"in": vals}}, separators=(",", ":"))) - MAX_FILTER_BYTES)]
    at = {"u": {"in": vals}}
    assert len(json.dumps(at, separators=(",", ":"))) == MAX_FILTER_BYTES
    assert parse_filter(at).matches({"u": vals[3]})
    with pytest.raises(InputError, match="over 65536 bytes"):
        parse_filter({"u": {"in": vals[:-1] + [vals[-1] + "1"]}})
    for f in ({"and": [{}] * 21845}, {"and": [{}] * 21846}):  # 3 bytes an item: about the bound, by nodes
        n = len(json.dumps(f, separators=(",", ":")))
        with pytest.raises(InputError, match="over 65536 bytes" if n > MAX_FILTER_BYTES else "nodes"):
            parse_filter(f)
    with pytest.raises(InputError, match="over 65536 bytes"):
        parse_filter({"u": "x" * 10_000_000})
    deep = {}
    for _ in range(5000):  # any nesting: the size walk does not recurse
        deep = {"not": deep}
    with pytest.raises(InputError, match="deeper than"):
        parse_filter(deep)
