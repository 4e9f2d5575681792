"""The picks of one tree on the sample collection, as JSON (issue 43 item 1): ``Memory.select`` of 8
questions plain, with a filter, a token budget, hops 0 and a date, ``select_many`` with a filter per
query, and a 256-item ``SelectionService.process_batch`` (mixed B, T, vectors given or not, filters).
Run it once per tree over one collection and compare the two outputs::

    python benchmarks/experiments/select_path_picks.py /work/main COLL > old.json
    python benchmarks/experiments/select_path_picks.py /work/wt/onepath COLL > new.json

The sample turns carry no metadata: a filter on ``speaker`` passes no turn (the empty answer).
"""
import json
import sys


def main() -> None:
    root, coll = sys.argv[1], sys.argv[2]
    sys.path.insert(0, root)
    import trawmem_gpu
    assert trawmem_gpu.__file__.startswith(root)
    from trawmem_gpu import Memory
    qs = ["Where does Ben's sister live?", "What did Ana buy?", "When did they go hiking?", "What is Ana's job?",
          "What did Ben say about the cat?", "Which book did Ana read?", "Where did they meet?", "What happened first?"]
    mem = Memory(coll, create=False)
    out = {}
    for name, kw in (("plain", {}), ("where", {"where": {"speaker": "Ana"}}), ("tokens", {"token_budget": 200}),
                     ("hops0", {"hops": 0, "budget": 5}), ("dated", {"date": "2023-06-01"})):
        out[name] = [mem.select("ana-ben", q, **kw).unit_ids for q in qs]
        out[name + "_text"] = [mem.select("ana-ben", q, **kw).text for q in qs]
    out["many_where"] = [w.unit_ids for w in mem.select_many([("ana-ben", q) for q in qs], where=[{"speaker": "Ana"}, None] * 4)]
    del mem
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.service import SelectItem, SelectionService
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.data.filters import parse_filter
    svc = SelectionService(ServeConfig(collection=coll, warmup=False))
    Z = svc.encoder.encode(qs, is_query=True)
    items = [SelectItem("ana-ben", qs[i % 8], Z[i % 8] if i % 3 else None, QueryParams(budget=4 + i % 9, token_budget=None if i % 2 else 300),
                        where=parse_filter({"speaker": "Ben"}) if i % 5 == 0 else None) for i in range(256)]
    res = svc.process_batch(items)
    out["serve256"] = [(r.future.result()[r.index] if hasattr(r, "future") else r)["units"] for r in res]
    out["serve256"] = [[u["id"] for u in x] for x in out["serve256"]]
    svc.worker.shutdown(); svc.appender.shutdown(); svc.loader.shutdown(); svc.assembler.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
