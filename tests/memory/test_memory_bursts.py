"""Chat messages through the Python API: short messages of one speaker seconds apart are selected
and shown as one burst, and a message added later joins the open burst (issue 36)."""
from __future__ import annotations

import pytest

from trawmem_gpu.data.chat_views import view_conversation, view_spec
from trawmem_gpu.data.jsonl import record_of
from trawmem_gpu.data import load_conversations, sample_path


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def test_added_messages_are_selected_and_shown_as_bursts(tmp_path):
    from trawmem_gpu import Memory

    chat = view_conversation(load_conversations(sample_path())[0], view_spec("split"))[0]
    recs = [record_of(t) | {"timestamp": t.time.isoformat()} for t in chat.turns]  # each message its own time
    assert [t.turn_id for t in chat.turns[-2:]] == ["S3:10.1", "S3:10.2"]  # Ben's last thought, 3 s apart
    mem = Memory(tmp_path / "coll", embedding_cache=False)
    mem.add("ana-ben", recs[:-1])
    ws = mem.select("ana-ben", "Where does Ben's sister live?", token_budget=400)
    lines = [x for x in ws.text.splitlines() if x.startswith("[")]
    assert len(lines) == len(ws.units) < len(ws.unit_ids)  # a line per burst, not per message
    assert [x[1:x.index("]")] for x in lines] == [u.id for u in ws.units]
    assert any(len(u.members) > 1 for u in ws.units) and ws.unit_ids == [m for u in ws.units for m in u.members]
    mem.add("ana-ben", recs[-1:])  # the last message joins the open burst
    ws2 = mem.select("ana-ben", "Which city in October, and what about the knee?", token_budget=400)
    burst = next(u for u in ws2.units if u.id == "S3:10.1")
    assert burst.members == ("S3:10.1", "S3:10.2") and burst.text == "Lisbon in October sounds perfect. Just listen to that knee."
    line = next(x for x in ws2.text.splitlines() if x.startswith("[S3:10.1]"))
    assert line.endswith("Lisbon in October sounds perfect. Just listen to that knee.")
