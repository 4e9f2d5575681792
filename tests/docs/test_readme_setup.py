"""The README's setup installs into a virtual environment."""
from __future__ import annotations


from cli_inputs import ROOT


def test_readme_setup_uses_a_virtual_environment():
    readme = (ROOT / "README.md").read_text()
    setup = readme[:readme.index("## Python")]
    assert "python3 -m venv" in setup and "activate" in setup
