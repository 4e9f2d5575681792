"""Bank ids in URL paths: one path segment, percent-encoded (``user-42/run-7`` is
``/v1/banks/user-42%2Frun-7/turns``), as the client sends them.

An ASGI server hands the app the path already percent-decoded, where a ``/`` of a bank id can no
longer be told from the path's own, so the routes would never see such a bank. The app's edge
(``app._Edge``) calls :func:`route_path` first: from the raw path it decodes the bank's segment
and the rest of the path strictly as UTF-8 (a path that is not is refused, 422, rather than
turned into ``"\\ufffd"`` ids), and hands the router the path with the bank's segment still
encoded; the routes' ``{bank_id:bank}`` parameter (:class:`BankIdConvertor`) decodes it. A bank
id never spans segments, so ``/v1/banks/a/b/turns`` is no route (404), whatever banks exist;
turn and unit ids, the last parameter of their routes, keep taking a ``/`` either way.
"""
from __future__ import annotations

from urllib.parse import quote, unquote, unquote_to_bytes

from starlette.convertors import Convertor, register_url_convertor

PREFIX = "/v1/banks/"


class BadPath(ValueError):
    """A path under :data:`PREFIX` that is not UTF-8 once percent-decoded."""


class BankIdConvertor(Convertor):
    """``{bank_id:bank}``: one path segment, percent-decoded (the edge left it encoded)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return quote(value, safe="")


register_url_convertor("bank", BankIdConvertor())


def _decoded(raw: bytes) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise BadPath("the request path is not UTF-8 once percent-decoded (bank, turn and unit ids "
                      "are UTF-8 text)") from None


def route_path(scope) -> str | None:
    """The path to route ``scope`` by: under :data:`PREFIX`, the bank's segment kept encoded and the
    rest decoded; None for another path. Raises :class:`BadPath` for a path that is not UTF-8. A
    server that gives no ``raw_path`` (the ASGI spec makes it optional) has its decoded path's first
    segment taken as the bank id: ids without ``/`` route as before, never decoded twice."""
    raw = scope.get("raw_path")
    if raw:
        if not raw.startswith(PREFIX.encode()):
            return None
        seg, sep, rest = raw[len(PREFIX):].split(b"?", 1)[0].partition(b"/")
        bank, sep, rest = _decoded(seg), sep.decode(), _decoded(rest)
    else:
        path = scope.get("path", "")
        if not path.startswith(PREFIX):
            return None
        bank, sep, rest = path[len(PREFIX):].partition("/")
    return PREFIX + quote(bank, safe="") + sep + rest
