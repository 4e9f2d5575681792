"""Tenants and API keys: a JSON file maps sha256(key) to a tenant scoped to bank-id patterns.

File layout (``trawmem serve-key`` writes it; only hashes are stored, never a key)::

    {"keys": [{"sha256": "<64 hex>", "tenant": "acme", "banks": ["acme-*"], "access": "read-write"},
              {"sha256": "<64 hex>", "tenant": "acme-ro", "banks": ["acme-*"], "access": "read-only",
               "limits": {"max_queued": 64, "max_appends": 1, "batch_share": 8}}]}

``limits`` (optional, each field optional) overrides the server's per-key defaults
(``ServeConfig.tenant_max_queued`` / ``tenant_max_appends`` / ``tenant_batch_share``) for that
key: most queries waiting for a batch, most appends in flight (beyond either the key gets 429
with ``Retry-After``), most of its queries in one engine batch. The
limits, and the fair share of each batch, are per tenant name: keys of one tenant share them.
``where`` (optional) binds the key to a filter over turn metadata (``data.filters``, e.g.
``{"user_id": "u1"}``; ``trawmem serve-key --where``): every selection the key makes is AND-ed
with it, so a request's own ``where`` can narrow it but never widen it; the key may append only
turns whose metadata passes it, forget only such turns by id (others answer as missing), and
never a whole bank. ``token_budget`` (optional, ``trawmem serve-key --token-budget``) is the key's
default workspace budget on the chat-completions proxy (:mod:`.proxy`; else the server's
``proxy_token_budget``). ``banks`` are shell-style patterns (``fnmatch``, case-sensitive). A key is compared against
*every* stored hash with ``hmac.compare_digest`` (no early exit), so the time taken does not
depend on which entry, if any, matches. Keys are never logged, counted in metrics or echoed
in errors: the service only ever handles the :class:`Tenant` a key resolves to.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from ..errors import ConfigError, read_json

ACCESS = ("read-only", "read-write")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


LIMIT_FIELDS = ("max_queued", "max_appends", "batch_share")


@dataclass(frozen=True)
class Limits:
    """A key's own limits from the keys file (None: the server's default)."""

    max_queued: int | None = None
    """Most queries waiting for a batch (default ``ServeConfig.tenant_max_queued``)."""
    max_appends: int | None = None
    """Most appends in flight (default ``ServeConfig.tenant_max_appends``)."""
    batch_share: int | None = None
    """Most of its queries in one engine batch (default ``ServeConfig.tenant_batch_share``)."""


@dataclass(frozen=True)
class Quota:
    """The limits a request is held to: its tenant's, resolved against the server's defaults.
    None: no per-key limit (the tenant of a server without keys file)."""

    key: str
    max_queued: int | None
    max_appends: int | None
    batch_share: int | None = None


@dataclass(frozen=True)
class Tenant:
    """Who a key belongs to and what it may touch."""

    name: str
    banks: tuple[str, ...]
    """Bank-id patterns this tenant owns."""
    writable: bool
    """May append turns (and create banks matching ``banks``)."""
    limits: Limits | None = Limits()
    """Per-key limits; None: none (only the server-wide queue bound)."""
    where: object = None
    """The filter (``data.filters.Filter``) this key is bound to, AND-ed with every request's;
    None: none."""
    token_budget: int | None = None
    """The key's default workspace token budget on the chat-completions proxy (None: the server's)."""

    def owns(self, bank_id: str) -> bool:
        return any(fnmatchcase(bank_id, p) for p in self.banks)

    def narrowed(self, where, name: str = "where"):
        """The filter a request of this key selects with: its ``where`` (JSON or a ``Filter``;
        ``InputError`` naming ``name`` and the path inside) AND this key's (``data.filters.both``)."""
        from ..data.filters import both, parse_filter

        return both(self.where, parse_filter(where, name))

    def may_store(self, metadata) -> bool:
        """Whether this key may append a turn with ``metadata`` (it passes the key's filter).
        Metadata the turn rules refuse is let through here: the append refuses it, naming why."""
        from ..data.metadata import metadata_field
        from ..errors import InputError

        if self.where is None:
            return True
        try:
            return self.where.matches(metadata_field(metadata, "turn"))
        except InputError:
            return True

    def quota(self, cfg) -> Quota:
        """This tenant's limits under ``cfg`` (a ``ServeConfig``)."""
        lim = self.limits
        if lim is None:
            return Quota(self.name, None, None, None)
        pick = lambda own, default: default if own is None else own  # noqa: E731
        return Quota(self.name, pick(lim.max_queued, cfg.tenant_max_queued),
                     pick(lim.max_appends, cfg.tenant_max_appends), pick(lim.batch_share, cfg.tenant_batch_share))


LOCAL_TENANT = Tenant("local", ("*",), True, None)
"""Everything, read-write, no per-key limits: the tenant of every request when no keys file is
configured (one tenant: the server-wide queue bound is its bound)."""


def _limits(e: dict, where: str) -> Limits:
    lim = e.get("limits", {})
    if not isinstance(lim, dict) or set(lim) - set(LIMIT_FIELDS):
        raise ConfigError(f"{where}: field 'limits' must be an object with keys among {LIMIT_FIELDS}")
    for k, v in lim.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}: limits.{k} must be a whole number >= 1, got {v!r}")
    return Limits(**lim)


def _where(e: dict, where: str):
    """A keys-file entry's bound filter (``where``), parsed, or None."""
    from ..data.filters import parse_filter
    from ..errors import InputError

    if e.get("where") is None:
        return None
    try:
        return parse_filter(e["where"], "where")
    except InputError as x:
        raise ConfigError(f"{where}: field {x}") from None


def _token_budget(e: dict, where: str) -> int | None:
    """A keys-file entry's ``token_budget`` (a whole number >= 1), or None."""
    v = e.get("token_budget")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ConfigError(f"{where}: field 'token_budget' must be a whole number >= 1, got {v!r}")
    return v


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyStore:
    """The parsed keys file; :meth:`authenticate` resolves a presented key to its tenant."""

    def __init__(self, entries: list[tuple[bytes, Tenant]]):
        if not entries:
            raise ConfigError("the keys file holds no keys")
        self._entries = entries

    @property
    def tenants(self) -> list[Tenant]:
        return [t for _, t in self._entries]

    @classmethod
    def load(cls, path: str | Path) -> "KeyStore":
        path = Path(path)
        doc = read_json(path, f"`keys_file` {path}", "not valid JSON", ConfigError)
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise ConfigError(f'`keys_file` {path}: expected {{"keys": [...]}}')
        entries, seen = [], set()
        for i, e in enumerate(doc["keys"]):
            where = f"`keys_file` {path}: keys[{i}]"
            if not isinstance(e, dict):
                raise ConfigError(f"{where}: expected an object")
            h, name, banks, access = e.get("sha256"), e.get("tenant"), e.get("banks"), e.get("access")
            if not isinstance(h, str) or not _HEX64.match(h.lower()):
                raise ConfigError(f"{where}: field 'sha256' must be 64 hex digits (the sha256 of the key)")
            if h.lower() in seen:
                raise ConfigError(f"{where}: the same key hash appears twice")
            seen.add(h.lower())
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{where}: field 'tenant' must be a non-empty string")
            if (not isinstance(banks, list) or not banks
                    or not all(isinstance(p, str) and p for p in banks)):
                raise ConfigError(f"{where}: field 'banks' must be a non-empty list of bank-id patterns")
            if access not in ACCESS:
                raise ConfigError(f"{where}: field 'access' must be one of {ACCESS}")
            entries.append((bytes.fromhex(h.lower()),
                            Tenant(name, tuple(banks), access == "read-write", _limits(e, where), _where(e, where),
                                   _token_budget(e, where))))
        return cls(entries)

    def authenticate(self, key: str | None) -> Tenant | None:
        """The tenant of ``key``, or None for a missing or unknown key (constant time in the entry)."""
        if not key:
            return None
        digest = hash_key(key)
        found = None
        for h, tenant in self._entries:  # no early exit: every entry is compared
            if hmac.compare_digest(h, digest):
                found = tenant
        return found


def add_key(path: str | Path, tenant: str, banks: list[str], writable: bool, where=None,
            token_budget: int | None = None) -> str:
    """Append a fresh random key for ``tenant`` to the keys file (created if missing, written
    atomically, mode 0600) and return the key; the file keeps only its sha256. ``where``: a filter
    to bind the key to (JSON; checked here, ``InputError`` naming the path inside it); ``token_budget``:
    its default workspace budget on the chat-completions proxy."""
    from ..data.filters import parse_filter

    flt = parse_filter(where, "where")
    _token_budget({"token_budget": token_budget}, "token_budget")
    path = Path(path)
    doc = {"keys": []}
    if path.exists():
        KeyStore.load(path)  # refuse to extend a broken file
        doc = read_json(path, f"`keys_file` {path}", "not valid JSON", ConfigError)
    key = "tmk_" + secrets.token_urlsafe(32)
    doc["keys"].append({"sha256": hashlib.sha256(key.encode()).hexdigest(), "tenant": tenant,
                        "banks": list(banks), "access": "read-write" if writable else "read-only",
                        **({"where": flt.json} if flt is not None else {}),
                        **({"token_budget": token_budget} if token_budget is not None else {})})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return key
