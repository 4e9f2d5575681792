"""The client's results are the server's wire models, field for field.

The wire models (``serve/models.py``: pydantic) are declared once; the client's results
(``client/results.py``) are stdlib dataclasses because the client installs without pydantic (the
serve extra brings it). This holds them together: every field the server answers with is a field
of the client's result, of the same kind (text, whole number, list of the matching result, ...),
with a default where the server may leave it out, bar the few listed with their reason."""
from __future__ import annotations

import types
import typing
from dataclasses import MISSING, fields, is_dataclass

import pytest

pytest.importorskip("pydantic", reason="the serve extra is not installed (the wire models are pydantic models)")

from pydantic import BaseModel  # noqa: E402

from trawmem_gpu.client import results as R  # noqa: E402
from trawmem_gpu.serve import models as M  # noqa: E402

PAIRS = {R.Unit: M.Unit, R.ThreadHead: M.ThreadHead, R.Timings: M.Timings, R.SelectResult: M.SelectResponse,
         R.BankSummary: M.BankSummary, R.BankList: M.BankList, R.BankInfo: M.BankInfo, R.AppendItem: M.AppendItemOut,
         R.AppendResult: M.AppendResponse, R.HistoryEvent: M.HistoryEvent, R.History: M.History,
         R.ForgetResult: M.ForgetResponse, R.ImportRefused: M.ImportRefused, R.ImportResult: M.ImportResponse}
"""Each client result and the wire model it reads."""
LEFT_OUT = {(R.BankInfo, "quarantined"): "a bank's own route answers 409 for a quarantined bank, never a row with it",
            (R.AppendResult, "quarantined"): "an append to a quarantined bank is refused (409)"}
"""Wire fields a client result does not carry, and why."""
SAME_KIND = {(R.AppendResult, "stored"): "turn ids: the server stores them as text (str | int in the schema)",
             (R.AppendResult, "already_stored"): "as stored"}
"""Fields whose kinds differ on purpose, and why."""


def _kind(tp):
    """A field type reduced to what both sides must agree on: optional or not, and its shape."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return ("optional", _kind(rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]))
    if origin in (list, tuple):
        return ("list", _kind(args[0]))
    if origin is dict or tp is dict:
        return ("map",)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return ("object", tp.__name__)
    if is_dataclass(tp):
        return ("object", PAIRS[tp].__name__)
    return ("value", getattr(tp, "__name__", str(tp)))


@pytest.mark.parametrize("client_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_client_result_is_its_wire_model(client_cls):
    wire = PAIRS[client_cls]
    hints = typing.get_type_hints(client_cls)
    mine = {f.name: f for f in fields(client_cls)}
    assert set(mine) <= set(wire.model_fields), f"fields the server never sends: {set(mine) - set(wire.model_fields)}"
    for name, info in wire.model_fields.items():
        if (client_cls, name) in LEFT_OUT:
            assert name not in mine
            continue
        assert name in mine, f"{client_cls.__name__} lacks the wire field {name}"
        if (client_cls, name) in SAME_KIND:
            continue
        want, got = _kind(info.annotation), _kind(hints[name])
        # the same kind; or, where the server always sends it, optional in the client (an older server's answer)
        assert got in (want, ("optional", want)), f"{client_cls.__name__}.{name}: {got} != the wire's {want}"
        has_default = mine[name].default is not MISSING or mine[name].default_factory is not MISSING
        assert has_default or info.is_required(), f"{client_cls.__name__}.{name}: the server may leave it out"
