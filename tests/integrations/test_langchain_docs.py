"""The LangChain example of docs/integrations.md runs as written (offline: its own stand-in chat model,
the real langchain and engine) and prints what its comments say."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("langchain")
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def example() -> str:
    section = DOC.read_text(encoding="utf-8").split("## LangChain", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_example_runs_and_prints_its_comments():
    code = example()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
    printed = out.getvalue().splitlines()
    promised = [m.strip() for m in re.findall(r"^print\(.*?\)\s+# (.*)$", code, re.M)]
    assert len(promised) == 2 and printed == promised
