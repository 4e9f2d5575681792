"""The LLM tests of this folder run without an API key from the environment (a developer's own
``TRAWMEM_API_KEY`` / ``OPENAI_API_KEY`` would change what the clients send)."""
import pytest


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("TRAWMEM_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
