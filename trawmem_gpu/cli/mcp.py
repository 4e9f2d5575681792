"""`trawmem mcp`: the command line of the MCP server (``mcp/server.py``); its flags and their checks."""
from __future__ import annotations

import sys

from ..errors import ConfigError
from ..mcp.server import LOCAL_HOSTS, build_server, http_app


def _tenant_of_flags(a):
    from ..serve.keys import Tenant

    return Tenant("local", tuple(a.banks or ("*",)), not a.read_only)


LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_at(level: str) -> None:
    """Drop every log record below ``level`` (stderr is the user's terminal or the assistant's
    log): the root logger's handlers (the SDK's) filter at it, whatever level a library set on its
    own logger (bm25s sets DEBUG on its own)."""
    import logging

    root = logging.getLogger()
    root.setLevel(level.upper())
    for h in root.handlers:
        h.setLevel(level.upper())


def cmd_mcp(a) -> int:
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        raise ConfigError("`trawmem mcp` needs the mcp SDK: pip install 'trawmem_gpu[mcp]'")
    if a.http and a.keys is None and a.host not in LOCAL_HOSTS:
        raise ConfigError(f"--host {a.host} without --keys: an MCP server without API keys binds to 127.0.0.1 only")
    if a.keys is not None and not a.http:
        raise ConfigError("--keys is for --http (a stdio server's caller is the local user; see --banks)")
    if a.keys is not None and (a.banks or a.read_only):
        raise ConfigError("--banks and --read-only are for a server without --keys (a key names its own banks)")
    from ..memory import Memory

    if a.http:  # the port first: a busy one is one line (exit 2), before the memory loads
        from ..serve.config import bound_socket

        sock = bound_socket(a.host, a.port)
        try:
            return _serve_http(a, Memory(a.collection, encoder=a.encoder), sock)
        finally:
            sock.close()
    memory = Memory(a.collection, encoder=a.encoder)
    tenant = _tenant_of_flags(a)
    print(f"trawmem mcp: {a.collection} on stdio ({len(memory.banks())} banks)", file=sys.stderr, flush=True)
    server = build_server(memory, lambda ctx: tenant, default_token_budget=a.token_budget, log_level=a.log_level)
    _log_at(a.log_level)
    server.run("stdio")
    return 0


def _serve_http(a, memory, sock) -> int:
    """``trawmem mcp --http`` on ``sock`` (bound to --host:--port)."""
    import uvicorn

    from ..serve.keys import KeyStore

    keys = KeyStore.load(a.keys) if a.keys else None
    app = http_app(memory, keys, host=a.host, token_budget=a.token_budget,
                   tenant=None if keys else _tenant_of_flags(a), log_level=a.log_level)
    _log_at(a.log_level)
    auth = f"API keys from {a.keys}" if keys else "no keys file: WITHOUT authentication, 127.0.0.1 only"
    print(f"trawmem mcp: {a.collection} on http://{a.host}:{sock.getsockname()[1]}/mcp (streamable HTTP); {auth}",
          file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=a.log_level, server_header=False)).run(sockets=[sock])
    return 0


def configure(m) -> None:
    from .args import port_int, token_budget_int

    m.describe("Serve the memory to MCP clients (desktop assistants, IDEs, agent frameworks) with the tools "
               "add_turns, recall, forget, forget_bank and list_banks: over stdio (default) or streamable HTTP (--http) with "
               "the tenant keys of `trawmem serve`. Needs the mcp extra.")
    m.add_argument("--collection", required=True, help="collection directory (created when missing)")
    m.add_argument("--http", action="store_true", help="streamable HTTP on --host:--port/mcp instead of stdio")
    m.add_argument("--host", default="127.0.0.1", help="--http: bind address; other than 127.0.0.1 needs --keys")
    m.add_argument("--port", type=port_int, default=8765, help="--http: TCP port (0: a free one)")
    m.add_argument("--keys", help="--http: keys file of `trawmem serve-key` (sha256 of API keys -> tenants) "
                                  "(default: none: every bank, 127.0.0.1 only)")
    m.add_argument("--banks", nargs="+", help="without --keys: the bank-id patterns callers may see, e.g. "
                                              "'ana-*' (default: all, every bank)")
    m.add_argument("--read-only", action="store_true", help="without --keys: recall and list only")
    m.add_argument("--token-budget", type=token_budget_int, default=800,
                   help="a recall's token budget when the caller names none")
    m.add_argument("--log-level", choices=LOG_LEVELS, default="warning",
                   help="least severe log records written to stderr")
    m.add_argument("--encoder", help="query encoder (default: the collection's, else minilm)")
    m.set_defaults(fn=cmd_mcp)
