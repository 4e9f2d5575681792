"""``--where JSON`` on the command line: ``trawmem query`` selects among the turns that pass, a bad
filter is refused at parse time naming the flag and the path inside it; ``trawmem serve-key
--where`` binds a key to a filter in the keys file."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    d = tmp_path_factory.mktemp("where")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAWMEM_CACHE", str(d / "cache"))
    rows = [{"bank_id": "b", "turn_id": f"t{i}", "speaker": "Ana", "text": f"I went to the pottery class, day {i}.",
             "timestamp": f"2024-03-{i + 1:02d}", "metadata": {"user_id": f"u{i % 2}", "n": i}} for i in range(8)]
    assert main(["build", "--quiet", "--input", str(_jsonl(d / "t.jsonl", rows)), "--out", str(d / "c")]) == 0
    yield d / "c"
    mp.undo()


def test_query_where_selects_among_the_passing_turns(coll, capsys):
    capsys.readouterr()
    assert main(["query", "--bank", str(coll), "--question", "Where did I go?", "--json",
                 "--where", '{"user_id": "u1", "n": {"lt": 6}}']) == 0
    got = json.loads(capsys.readouterr().out)["units"]
    assert got and set(got) <= {"t1", "t3", "t5"}
    assert main(["query", "--bank", str(coll), "--question", "Where did I go?", "--json", "--method", "cosine",
                 "--where", '{"n": {"gte": 6}}']) == 0
    assert set(json.loads(capsys.readouterr().out)["units"]) == {"t6", "t7"}


@pytest.mark.parametrize("where,why", [("{user_id: u1}", "argument --where: not JSON"),
                                       ('{"n": {"gt": "six"}}', "argument --where: where.n.gt: expected a number"),
                                       ('["u1"]', "argument --where: where: expected a filter object"),
                                       ('{"and": [' + "{}, " * 1_000_000 + "{}]}",
                                        "argument --where: where: the filter is over 65536 bytes"),
                                       ('{"not":' * 10_000 + "{}" + "}" * 10_000,  # not RecursionError (issue 42)
                                        "argument --where: not JSON (JSON nested too deeply")])
def test_a_bad_where_is_refused_at_parse_time(tmp_path, capsys, where, why):
    with pytest.raises(SystemExit) as e:
        main(["query", "--bank", str(tmp_path), "--question", "q", "--where", where])
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_serve_key_binds_a_filter(tmp_path, capsys):
    from trawmem_gpu.serve.keys import KeyStore

    keys = tmp_path / "keys.json"
    assert main(["serve-key", "--keys", str(keys), "--tenant", "t", "--banks", "*", "--where",
                 '{"user_id": "u1"}']) == 0
    key = capsys.readouterr().out.strip()
    assert json.loads(keys.read_text())["keys"][0]["where"] == {"user_id": {"eq": "u1"}}
    assert KeyStore.load(keys).authenticate(key).where.matches({"user_id": "u1"})
    assert main(["serve-key", "--keys", str(keys), "--tenant", "t", "--banks", "*"]) == 0
    plain = capsys.readouterr().out.strip()
    assert KeyStore.load(keys).authenticate(plain).where is None
    doc = json.loads(keys.read_text())
    doc["keys"][0]["where"] = {"user_id": None}
    keys.write_text(json.dumps(doc))
    from trawmem_gpu.errors import ConfigError

    with pytest.raises(ConfigError, match=r"keys\[0\]: field where\.user_id: null is not a value"):
        KeyStore.load(keys)
    doc["keys"][0]["where"] = {"and": [{}] * 1_000_000}  # the size bound, in a keys file and at serve-key
    keys.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"keys\[0\]: field where: the filter is over 65536 bytes"):
        KeyStore.load(keys)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["serve-key", "--keys", str(tmp_path / "k2.json"), "--tenant", "t", "--banks", "*", "--where",
              json.dumps({"and": [{}] * 1_000_000})])
    assert e.value.code == 2
    assert "where: the filter is over 65536 bytes" in capsys.readouterr().err


def test_serve_key_and_the_keys_file_refuse_a_where_nested_past_the_parser(tmp_path, capsys):
    """A 10,000-deep ``where`` is a clear refusal, not a ``RecursionError`` (issue 42): from
    ``serve-key --where`` (usage error) and from a keys file (``ConfigError`` naming the file)."""
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.serve.keys import KeyStore

    deep = '{"not":' * 10_000 + '{"user_id": "u1"}' + "}" * 10_000
    keys = tmp_path / "keys.json"
    with pytest.raises(SystemExit) as e:
        main(["serve-key", "--keys", str(keys), "--tenant", "t", "--banks", "*", "--where", deep])
    assert e.value.code == 2 and "argument --where: not JSON (JSON nested too deeply" in capsys.readouterr().err
    assert not keys.exists()
    keys.write_text('{"keys": [{"sha256": "%s", "tenant": "t", "banks": ["*"], "access": "read-only", "where": %s}]}'
                    % ("0" * 64, deep))
    with pytest.raises(ConfigError, match=r"`keys_file` .*keys.json: not valid JSON \(JSON nested too deeply"):
        KeyStore.load(keys)
