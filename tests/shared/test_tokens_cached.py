"""``tokens.count_tokens_cached`` (the exact token count of a rendered workspace from per-line
counts kept across calls) equals ``count_tokens`` on the whole text: on random texts built to
break it (blank-line joins, trailing and odd whitespace after a newline, continuation lines,
special-token text, the final strip) and on real workspaces of the dev banks, cold and warm."""
import unicodedata

import numpy as np
import pytest

from trawmem_gpu import tokens
from trawmem_gpu.tokens import count_tokens, count_tokens_cached

BITS = ["[a:1] Bob:", "## 2 May 2023 —", " word", "?)", "...", " ", "  ", "\t", "\n  more", "\n", "\n\n", "\r\n",
        "42", "'s", "é", "—", "!!", ":", "<|endoftext|>", "\u00a0", "\u2028", "\x85", "\x1c", "\u3000", "#", "[", "x"]


def _random_text(rng) -> str:
    """Lines as ``Workspace.render`` joins them (blank lines between blocks, then strip + newline),
    or a raw concatenation of the bits (no structure at all)."""
    if rng.random() < 0.3:
        return "".join(rng.choice(BITS, size=int(rng.integers(0, 30))))
    out = []
    for _ in range(int(rng.integers(0, 5))):
        out += ["".join(rng.choice(BITS, size=int(rng.integers(1, 8)))) for _ in range(int(rng.integers(1, 5)))]
        out.append("")
    return "\n".join(out).strip() + "\n"


@pytest.fixture(autouse=True)
def _cold_cache():
    tokens._piece_counts.clear()
    yield
    tokens._piece_counts.clear()


def test_random_texts_count_exactly():
    rng = np.random.default_rng(7)
    texts = [_random_text(rng) for _ in range(3000)]
    want = [count_tokens(t) for t in texts]
    assert [count_tokens_cached(t) for t in texts] == want  # cold, then filling
    assert [count_tokens_cached(t) for t in texts] == want  # warm: every part from the cache
    assert count_tokens_cached("") == 0 and count_tokens_cached("\n") == count_tokens("\n")


def test_space_like_characters_after_a_newline():
    """Every control, format and separator character (where Python's and tiktoken's ideas of
    whitespace could differ) right after a cut point, after text that ends each way."""
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000
             and unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp", "Cc", "Cf")]
    assert len(chars) > 200
    for c in chars:
        for a in ("[x] y.", "[x] y ", "## z"):
            for b in ("w", " ", "\n", ""):
                t = f"{a}\n{c}{b}\n[q] r\n"
                assert count_tokens_cached(t) == count_tokens(t), (hex(ord(c)), a, b)


def test_cache_bound_keeps_counts_exact(monkeypatch):
    monkeypatch.setattr(tokens, "MAX_CACHED_PIECES", 5)
    rng = np.random.default_rng(3)
    for _ in range(300):
        t = _random_text(rng)
        assert count_tokens_cached(t) == count_tokens(t)
        assert len(tokens._piece_counts) <= max(5, t.count("\n") + 1)


def test_other_tokenizers_fall_back_to_the_full_count(monkeypatch):
    assert tokens._line_starts() is not None  # cl100k_base counts lines apart
    monkeypatch.setattr(tokens, "_line_starts", lambda: None)
    seen = []
    monkeypatch.setattr(tokens, "count_tokens", lambda t: seen.append(t) or 11)
    assert count_tokens_cached("[a] b\n[c] d\n") == 11 and seen == ["[a] b\n[c] d\n"]
    assert not tokens._piece_counts


def test_real_workspaces_count_exactly(dev_path):
    """Random unit sets (1-40 units, odd sizes) of the dev banks, under every ``headings`` mode
    (date and gist, date only, none: every line then carries its date): the cached count is the
    count of the rendered text, and the knapsack's additive token costs (``token_costs``, which
    credit same-date threads their shared heading) bound it from above."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.eval.retrieval import banks_for
    from trawmem_gpu.select.workspace import HEADINGS, assemble, token_costs

    _, banks, _ = banks_for(dev_path, BuildConfig(), progress=False)
    rng = np.random.default_rng(0)
    n, shared, over = 0, 0, []
    for bank in banks[:4]:
        costs = {h: token_costs(bank, h) for h in HEADINGS}
        for _ in range(100):
            k = int(rng.integers(1, min(41, bank.n_units + 1)))
            units = rng.choice(bank.n_units, size=k, replace=False).tolist()
            for headings in HEADINGS:
                w = assemble(bank, "q", units, headings)
                text = w.render()
                assert count_tokens_cached(text) == count_tokens(text) == w.n_tokens
                est = costs[headings].cost(units, bank.unit_thread)
                assert est >= w.n_tokens, (bank.bank_id, headings, sorted(units), est, w.n_tokens)
                over.append(est - w.n_tokens)
                heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
                shared += len(w.blocks) - len(heads) if headings == "date" else 0
                n += 1
    assert n == 400 * len(HEADINGS) and len(tokens._piece_counts) > 100
    assert shared > 100  # same-date threads did share headings, and the bound held with them
    assert np.mean(over) < 1.0  # ... and stayed tight (the merged headings are credited)
