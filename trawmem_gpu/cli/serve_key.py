"""``trawmem serve-key``: create an API key for ``trawmem serve`` (printed once, stored as its sha256)."""
from __future__ import annotations

import sys

from .args import add_where


def cmd_serve_key(a) -> int:
    from ..serve.keys import add_key

    key = add_key(a.keys, a.tenant, a.banks, writable=not a.read_only, where=a.where,
                  token_budget=a.token_budget)
    bound = f", bound to the filter {a.where.key}" if a.where is not None else ""
    print(f"added a {'read-only' if a.read_only else 'read-write'} key for tenant {a.tenant!r} "
          f"(banks {', '.join(a.banks)}{bound}) to {a.keys}; it is shown once, only its sha256 is stored:",
          file=sys.stderr)
    print(key)
    return 0


def configure(k) -> None:
    k.describe("Create an API key for `trawmem serve`: the key is printed once on stdout, and only its sha256 is "
               "stored in the keys file, with the tenant and the bank-id patterns it may read (and append to).")
    k.add_argument("--keys", required=True, help="keys file to add to (created when missing)")
    k.add_argument("--tenant", required=True, help="tenant name the key belongs to")
    k.add_argument("--banks", nargs="+", required=True, help="bank-id patterns the key owns, e.g. 'acme-*'")
    k.add_argument("--read-only", action="store_true", help="may select but not append")
    add_where(k, "bind the key to a filter over turn metadata, e.g. '{\"user_id\": \"u1\"}': every selection is "
                 "AND-ed with it (a request's where narrows it, never widens it), appends must pass it, forgets "
                 "reach only turns that pass it (default: no filter, the key sees every turn of its banks)")
    from .args import positive_int

    k.add_argument("--token-budget", type=positive_int, default=None,
                   help="the key's default workspace token budget on the chat-completions proxy "
                        "(default: the server's --proxy-token-budget)")
    k.set_defaults(fn=cmd_serve_key)
