"""Each framework's example in docs/integrations.md runs as written (offline: its own stand-in model,
the real framework and engine) and prints what its comments say."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def example(section: str) -> str:
    text = DOC.read_text(encoding="utf-8").split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("section, package", [("LangChain", "langchain"), ("LangGraph", "langgraph"),
                                                    ("OpenAI Agents SDK", "agents")])
def test_the_documented_example_runs_and_prints_its_comments(section, package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (the integrations' extras)")
    code = example(section)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
    printed = out.getvalue().splitlines()
    promised = [m.strip() for m in re.findall(r"^print\(.*?\)\s+# (.*)$", code, re.M)]
    assert len(promised) == 2 and printed == promised
