"""The limits the docs state are the code's (issue 42.10: `docs/serving.md` gave 65,536 as MCP's
text limit; a turn's text is at most ``MAX_TEXT_CHARS``, 131,072, at every door)."""
from __future__ import annotations

import re
from pathlib import Path

from trawmem_gpu.data.types import MAX_TEXT_CHARS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_text_limit_the_docs_give_is_the_code_s():
    serving = (DOCS / "serving.md").read_text()
    said = re.findall(r"text: String should have at most (\d+)\s+characters", serving)
    assert said and {int(n) for n in said} == {MAX_TEXT_CHARS}
    assert f"{MAX_TEXT_CHARS:,}" in serving and "65536" not in serving and "65,536" not in serving
    for doc in ("cli.md", "serving-limits.md", "python-api.md"):
        assert f"{MAX_TEXT_CHARS:,}" in (DOCS / doc).read_text(), doc
