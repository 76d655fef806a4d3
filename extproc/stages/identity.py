"""Who is calling: API key → tenant and tier; anonymous callers get the default."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ..config import TIERS, Caller
from ..config import Identity as IdentityConfig
from ..errors import error_reply
from ..exchange import Exchange, Reply
from .base import Stage

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services


def api_key(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


def key_id(key: str) -> str:
    """What logs and metrics may show of a key: never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def lower_tier(tier: str, requested: str | None) -> str:
    """`x-priority` may lower the caller's tier, never raise it."""
    if requested not in TIERS or requested is None:
        return tier
    return requested if TIERS.index(requested) > TIERS.index(tier) else tier


def resolve(
    config: IdentityConfig, headers: dict[str, str], keys: dict[str, Caller] | None = None
) -> Caller | None:
    """The caller for these headers (`keys`: every configured key, `config.keys()`; default the
    config file's own), or None for a missing or unknown key that must be rejected."""
    if config.trust_identity_headers and headers.get(config.tenant_header):
        tier = headers.get(config.tier_header, "standard")
        return Caller(tenant=headers[config.tenant_header], tier=tier if tier in TIERS else "standard")
    key = api_key(headers)
    if key is None:
        return None if config.missing_keys == "reject" else config.anonymous
    caller = (keys if keys is not None else config.api_keys).get(key)
    if caller is None and config.unknown_keys == "reject":
        return None
    return caller or config.anonymous


CREDENTIALS = ("authorization", "x-api-key")


class Identity(Stage):
    name = "identity"
    store_down = "not used"
    fail_closed = True

    def __init__(self, config: IdentityConfig) -> None:
        self.config = config
        self.keys = config.keys()  # read at start and on each reload

    @classmethod
    def build(cls, config: Config, services: Services) -> Identity:
        return cls(config.identity)

    async def on_headers(self, ex: Exchange) -> Reply | None:
        caller = resolve(self.config, ex.headers, self.keys)
        if caller is None:
            missing = api_key(ex.headers) is None
            return error_reply(
                401,
                "This gateway needs an API key: send 'Authorization: Bearer <key>'."
                if missing
                else "Incorrect API key provided. Check the key or ask the gate's operator for one.",
                code="missing_api_key" if missing else "invalid_api_key",
            )
        key = api_key(ex.headers)
        ex.upstream_remove.extend(CREDENTIALS)
        if not self.config.forward_identity_headers:
            c = self.config
            said = (c.tenant_header, c.tier_header, "x-priority")
            ex.upstream_remove.extend(h for h in said if h in ex.headers)
        ex.key_id = key_id(key) if key else None
        ex.tenant = caller.tenant
        ex.tier = caller.tier
        ex.priority = lower_tier(caller.tier, ex.headers.get("x-priority"))
        ex.user = caller.user or ex.headers.get("x-user-id") or ex.key_id
        return None
