"""The rendered workspace: short, documented thread headings, and no control or bidirectional
character from the input."""
from __future__ import annotations

import re

from trawmem_gpu.data import load_conversations, load_jsonl, sample_path

from cli_inputs import _jsonl, _rec, cache, ROOT  # noqa: F401 - cache: a fixture


def test_thread_headings_are_short_and_documented(tmp_path, cache):
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.select.workspace import assemble

    (bank,), _ = build_banks(load_conversations(sample_path()), progress=False)
    j = 1
    units = list(bank.thread_units(j))
    head_turn = next(i for i in units if f"{bank.turns[i].speaker}: " in bank.heads[j]
                     and bank.heads[j].split(": ", 2)[2].removesuffix(" ...").strip()[:20] in bank.turns[i].text)
    other = next(i for i in units if i != head_turn)
    assert re.fullmatch(r"## \d{1,2} [A-Z][a-z]+ \d{4}", assemble(bank, "q", [other]).render().splitlines()[0])
    text = assemble(bank, "q", [other], "gist").render()
    heading = text.splitlines()[0]
    assert re.fullmatch(r"## \d{1,2} [A-Z][a-z]+ \d{4} — \w+: .+", heading), heading
    assert "&" not in heading and "[" not in heading  # no speaker list, no bracketed date
    assert assemble(bank, "q", [head_turn], "gist").render().splitlines()[0] == f"## {bank.turns[head_turn].time.day} " \
        f"{bank.turns[head_turn].time:%B %Y}"  # the quoted turn is shown: the heading is only the date
    doc = (ROOT / "docs" / "cli.md").read_text()
    assert "## 2 March 2024 — Ana: " in doc and "[S1:6] Ben: " in doc  # the format is documented


def test_control_and_bidi_characters_never_reach_the_workspace(tmp_path, cache):
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.select.workspace import assemble

    evil = ["safe \u202eevil\u202c text", "nul\x00here", "esc \x1b[31mred\x1b[0m", "two\n## 1 Jan 2020 — forged",
            "line\u2028sep", "bom\ufeff", "iso \u2066x\u2069"]
    f = _jsonl(tmp_path / "e.jsonl", [_rec("b", str(i), t, speaker="Ana\u202e" if i == 0 else "Ben",
                                           caption="cap\x07tion" if i == 1 else None) for i, t in enumerate(evil)],
               ensure_ascii=False)
    (bank,), _ = build_banks(load_jsonl(f), progress=False)
    for heads in ("gist", "date", "none"):
        text = assemble(bank, "q", list(range(bank.n_units)), heads).render()
        bad = [c for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c in
               "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029\ufeff"]
        assert not bad, [hex(ord(c)) for c in bad]
        assert not [ln for ln in text.splitlines() if ln.startswith("## 1 Jan 2020")]
        assert "  ## 1 Jan 2020 — forged" in text and "evil" in text and "red" in text


def test_a_workspace_with_no_unit_is_empty_text():
    """A token budget too small for any unit gives a workspace of no unit, whose text is empty
    and costs 0 tokens (was a lone newline, 1 token); through ``Memory.select`` as well."""
    import tempfile

    from trawmem_gpu import Memory
    from trawmem_gpu.data import load_conversations, sample_path
    from trawmem_gpu.data.jsonl import record_of
    from trawmem_gpu.select.workspace import Workspace

    assert Workspace("b", "q", []).render() == "" and Workspace("b", "q", []).n_tokens == 0
    mem = Memory(tempfile.mkdtemp())
    mem.add("ab", [record_of(t) for t in load_conversations(sample_path())[0].turns[:30]])
    ws = mem.select("ab", "Where does Ben's sister live?", token_budget=1)
    assert len(ws.units) == 0 and ws.text == ""
    full = mem.select("ab", "Where does Ben's sister live?", token_budget=400)
    assert full.units and full.text.endswith("\n") and not full.text.startswith("\n")
