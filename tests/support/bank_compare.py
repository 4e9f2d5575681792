"""Two banks equal field by field."""
from __future__ import annotations

import numpy as np


def assert_banks_equal(a, b, exact=True):
    assert a.bank_id == b.bank_id
    assert a.turns == b.turns
    assert a.heads == b.heads
    assert a.head_kind == b.head_kind
    assert a.encoder_id == b.encoder_id
    assert a.build_config == b.build_config
    np.testing.assert_array_equal(a.thread_offsets, b.thread_offsets)
    for name in ("edge_src", "edge_dst", "edge_kind"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("unit_vecs", "head_vecs", "edge_w"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        if exact:
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-5, err_msg=name)
