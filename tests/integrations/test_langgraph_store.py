"""``TrawMemStore`` against LangGraph's ``BaseStore`` contract: the same contract tests run on
LangGraph's own ``InMemoryStore`` (the reference: it proves each test asks what the contract says)
and on ``TrawMemStore`` over the real engine; then what only ``TrawMemStore`` does (search under a
token budget, best first; erasure; refusals) and a real compiled ``StateGraph`` using the store.

LangGraph ships no store conformance suite in its packages, so the contract is written here from
its documented one (``langgraph.store.base``): ``get`` / ``put`` / ``delete`` / ``search`` /
``list_namespaces``, ``batch`` / ``abatch``, namespace rules, filters, paging. Semantic ranking is
not part of the shared contract (``InMemoryStore`` has no index here)."""
from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, PutOp, SearchOp  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402

from trawmem_gpu.errors import InputError  # noqa: E402
from trawmem_gpu.integrations.langgraph import TrawMemStore  # noqa: E402
from trawmem_gpu.memory import Memory  # noqa: E402

SEED = [
    (("ana", "prefs"), "food", {"text": "Ana is vegetarian and loves Thai curry.", "kind": "pref", "n": 3}),
    (("ana", "prefs"), "music", {"text": "Ana listens to jazz while she cooks.", "kind": "pref", "n": 1}),
    (("ana", "pets"), "cat", {"content": "Ana adopted a grey cat called Pixel.", "kind": "pet", "n": 5,
                              "tags": ["cat", "grey"], "meta": {"age": 2}}),
    (("ana", "trips", "2031"), "lisbon", {"text": "Ana flew to Lisbon to see her sister Maya.", "kind": "trip"}),
    (("ben", "prefs"), "food", {"text": "Ben hates coriander.", "kind": "pref", "n": 2}),
]


def _make(kind, tmp):
    return InMemoryStore() if kind == "reference" else TrawMemStore(Memory(tmp), token_budget=300)


@pytest.fixture(scope="module", params=["reference", "trawmem"])
def seeded(request, tmp_path_factory):
    """A store holding SEED, put in one batch (read-only tests share it)."""
    store = _make(request.param, tmp_path_factory.mktemp("seeded"))
    store.batch([PutOp(ns, k, v) for ns, k, v in SEED])
    return store


@pytest.fixture(params=["reference", "trawmem"])
def fresh(request, tmp_path):
    return _make(request.param, tmp_path / "coll")


def _keys(items):
    return sorted((it.namespace, it.key) for it in items)


# -- the shared contract ---------------------------------------------------------------------------
def test_get_returns_the_value_put_with_its_key_namespace_and_times(seeded):
    for ns, key, value in SEED:
        item = seeded.get(ns, key)
        assert (item.namespace, item.key, item.value) == (ns, key, value)
        assert isinstance(item.created_at, datetime) and item.created_at.tzinfo is not None
        assert item.created_at <= item.updated_at
    assert seeded.get(("ana", "prefs"), "nothing") is None


def test_search_without_a_query_lists_by_prefix(seeded):
    assert _keys(seeded.search(("ana",), limit=50)) == sorted((ns, k) for ns, k, _ in SEED if ns[0] == "ana")
    assert _keys(seeded.search(("ana", "prefs"))) == [(("ana", "prefs"), "food"), (("ana", "prefs"), "music")]
    assert _keys(seeded.search((), limit=50)) == sorted((ns, k) for ns, k, _ in SEED)
    assert seeded.search(("carl",)) == []
    got = seeded.search(("ana", "pets"))[0]
    assert got.value == SEED[2][2] and got.key == "cat"


def test_limit_and_offset_page_through_the_same_list(seeded):
    whole = seeded.search((), limit=50)
    pages = [it for off in range(0, len(whole), 2) for it in seeded.search((), limit=2, offset=off)]
    assert [(i.namespace, i.key) for i in pages] == [(i.namespace, i.key) for i in whole]
    assert len(seeded.search((), limit=2)) == 2 and seeded.search((), offset=len(whole)) == []


@pytest.mark.parametrize("flt, keys", [
    ({"kind": "pref"}, [("ana", "prefs", "food"), ("ana", "prefs", "music"), ("ben", "prefs", "food")]),
    ({"kind": "pref", "n": {"$gt": 1}}, [("ana", "prefs", "food"), ("ben", "prefs", "food")]),
    ({"kind": "pref", "n": {"$gte": 3, "$lt": 5}}, [("ana", "prefs", "food")]),
    ({"kind": {"$ne": "pref"}}, [("ana", "pets", "cat"), ("ana", "trips", "2031", "lisbon")]),
    ({"kind": {"$eq": "trip"}}, [("ana", "trips", "2031", "lisbon")]),
])
def test_filters_match_value_fields(seeded, flt, keys):
    assert [(*ns, k) for ns, k in _keys(seeded.search((), filter=flt, limit=50))] == keys


def test_list_namespaces_by_prefix_suffix_depth_and_page(seeded):
    every = [("ana", "pets"), ("ana", "prefs"), ("ana", "trips", "2031"), ("ben", "prefs")]
    assert seeded.list_namespaces() == every
    assert seeded.list_namespaces(prefix=("ana",)) == every[:3]
    assert seeded.list_namespaces(suffix=("prefs",)) == [("ana", "prefs"), ("ben", "prefs")]
    assert seeded.list_namespaces(prefix=("*", "prefs")) == [("ana", "prefs"), ("ben", "prefs")]
    assert seeded.list_namespaces(prefix=("ana",), suffix=("2031",)) == [("ana", "trips", "2031")]
    assert seeded.list_namespaces(max_depth=1) == [("ana",), ("ben",)]
    assert seeded.list_namespaces(max_depth=2, prefix=("ana",)) == [("ana", "pets"), ("ana", "prefs"), ("ana", "trips")]
    assert seeded.list_namespaces(limit=2, offset=1) == every[1:3]


def test_abatch_answers_every_op_in_order(seeded):
    got = asyncio.run(seeded.abatch([GetOp(("ben", "prefs"), "food"), SearchOp(("ben",)),
                                     ListNamespacesOp(max_depth=1), GetOp(("ben", "prefs"), "none")]))
    assert got[0].value == SEED[4][2] and [i.key for i in got[1]] == ["food"]
    assert got[2] == [("ana",), ("ben",)] and got[3] is None


@pytest.mark.parametrize("ns", [("langgraph", "x"), ("a.b",), (), ("ok", "")])
def test_invalid_namespaces_are_refused_and_nothing_is_stored(fresh, ns):
    with pytest.raises(InvalidNamespaceError):
        fresh.put(ns, "k", {"text": "should not be kept"})
    assert fresh.search((), limit=10) == []


def test_put_replace_delete_and_a_batch_reads_before_it_writes(fresh):
    ns = ("ana", "notes")
    got = fresh.batch([PutOp(ns, "a", {"text": "first note"}), GetOp(ns, "a"), PutOp(ns, "b", {"text": "other"}),
                       PutOp(ns, "a", {"text": "second note"})])
    assert got == [None, None, None, None]  # the get saw the store before the batch's puts
    first = fresh.get(ns, "a")
    assert first.value == {"text": "second note"}  # the last put of a key wins
    fresh.put(ns, "a", {"text": "third note", "n": 7})
    again = fresh.get(ns, "a")
    assert again.value == {"text": "third note", "n": 7} and again.updated_at >= first.updated_at
    assert len(fresh.search(ns)) == 2
    fresh.delete(ns, "a")
    assert fresh.get(ns, "a") is None and [i.key for i in fresh.search(ns)] == ["b"]
    fresh.delete(ns, "never-there")  # not an error


# -- TrawMemStore only -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trawmem(seeded):
    if not isinstance(seeded, TrawMemStore):
        pytest.skip("TrawMemStore only")
    return seeded


def test_a_query_returns_the_engines_picks_best_first_within_the_budget(trawmem):
    got = trawmem.search(("ana",), query="What is the name of Ana's grey cat?", limit=3)
    assert got and got[0].key == "cat" and got[0].value == SEED[2][2]  # put third, picked first
    assert len(got) <= 3 and all(it.namespace[0] == "ana" for it in got)
    ws = trawmem.memory.select("ana", "What is the name of Ana's grey cat?", token_budget=300, budget=3,
                               where={"lg_id": {"exists": True}})
    by_id = {u.id: u.metadata["lg_key"] for u in ws.units}
    assert [it.key for it in got] == [by_id[p] for p in ws.picks]  # the pick order, not the time order
    assert ws.tokens <= 300
    tiny = trawmem.search(("ana",), query="What is the name of Ana's grey cat?", limit=3, offset=0)
    assert [i.key for i in tiny] == [i.key for i in got]
    small = trawmem.search(("ana", "prefs"), query="What does Ana eat?", limit=5, filter={"n": {"$gte": 3}})
    assert [i.key for i in small] == ["food"]


def test_the_budget_bounds_what_a_query_returns(trawmem):
    store = TrawMemStore(trawmem.memory, token_budget=60)
    few = store.search((), query="Tell me everything about Ana", limit=10)
    many = trawmem.search((), query="Tell me everything about Ana", limit=10)
    assert 0 < len(few) < len(many)


@pytest.mark.parametrize("value, field", [
    ("just text", "value"), ({"title": "no text"}, "value.text"), ({"text": 5}, "value.text"),
    ({"text": "   "}, "value.text"), ({"text": "ok", "x": float("nan")}, "value"),
])
def test_bad_values_are_clear_errors_and_store_nothing(trawmem, value, field):
    before = [t.turn_id for t in trawmem.memory.turns("ana")]
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        trawmem.batch([PutOp(("ana", "x"), "good", {"text": "a good one"}), PutOp(("ana", "x"), "bad", value)])
    assert [t.turn_id for t in trawmem.memory.turns("ana")] == before


@pytest.mark.parametrize("flt, field", [({"n": {"$in": [1]}}, "filter.n"), ({"bad key": 1}, "filter.bad key"),
                                        ({"kind": {"$gt": "a"}}, "filter"), ("kind", "filter")])
def test_bad_filters_name_the_filter(trawmem, flt, field):
    with pytest.raises(InputError, match=field):
        trawmem.search(("ana",), filter=flt)


def test_a_text_key_names_the_field_and_delete_leaves_no_trace(tmp_path):
    root = tmp_path / "coll"
    store = TrawMemStore(str(root), text_key="memory")
    secret = "Ana's locker code is 4417-quartz"
    store.batch([PutOp(("ana", "secrets"), "locker", {"memory": secret, "long": "x" * 3000}),
                 PutOp(("ana", "secrets"), "other", {"memory": "Ana likes tea."})])
    assert store.get(("ana", "secrets"), "locker").value == {"memory": secret, "long": "x" * 3000}
    with pytest.raises(InputError, match="value.memory"):
        store.put(("ana", "secrets"), "x", {"text": "no memory field"})
    assert [p for p in root.rglob("*") if p.is_file() and b"4417-quartz" in p.read_bytes()]
    store.delete(("ana", "secrets"), "locker")
    assert store.get(("ana", "secrets"), "locker") is None
    assert [str(p) for p in root.rglob("*") if p.is_file() and b"4417-quartz" in p.read_bytes()] == []
    assert [i.key for i in store.search(("ana",))] == ["other"]


def test_a_compiled_graph_reads_and_writes_through_the_runtime_store(tmp_path):
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime

    class State(TypedDict):
        question: str
        recalled: list

    def remember(state: State, runtime: Runtime) -> dict:
        runtime.store.put(("ana", "facts"), "sister", {"text": "Ana's sister Maya lives in Lisbon."})
        runtime.store.put(("ana", "facts"), "cat", {"text": "Ana's cat Pixel is grey."})
        return {}

    def recall(state: State, runtime: Runtime) -> dict:
        return {"recalled": [i.value["text"] for i in runtime.store.search(("ana",), query=state["question"], limit=1)]}

    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("recall", recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    store = TrawMemStore(tmp_path / "coll", token_budget=200)
    out = graph.compile(store=store).invoke({"question": "Where does Ana's sister live?", "recalled": []})
    assert out["recalled"] == ["Ana's sister Maya lives in Lisbon."]
    tight = graph.compile(store=store).invoke({"question": "Where does Ana's sister live?", "recalled": []},
                                              {"configurable": {"trawmem_token_budget": 20}})
    assert tight["recalled"] == []  # the run's budget, not the constructor's: too small for any item
    assert {t.metadata["lg_key"] for t in store.memory.turns("ana")} == {"sister", "cat"}
