"""Who a request counts against: client IP, caller, prompt fingerprint, and the buckets.

Pure: headers and payload in, a `Check` out. Keys hold tenant names, user ids, key hashes,
IPs and prompt hashes, never an API key or a prompt's text. Each key's owner is its hash tag
(`gate:rl:t:{acme}`), so on a Redis Cluster each bucket has a slot of its own.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from ..config import RateLimit
from ..exchange import Exchange
from ..request import prompt_texts
from ..textform import collapse_spaces
from .check import BucketSpec, Check, RepeatSpec
from .gcra import US
from .store import block_key, tagged


def client_ip(headers: dict[str, str], trusted_hops: int) -> str | None:
    """The address `trusted_hops` entries from the right of x-forwarded-for.

    Envoy (with `use_remote_address`) appends the peer it saw (for a loopback peer, the
    host's own address); entries further left were written by whoever sent the request and
    count only through trusted proxies.
    """
    hops = [p.strip() for p in headers.get("x-forwarded-for", "").split(",") if p.strip()]
    if not hops:
        return None
    return hops[max(0, len(hops) - 1 - trusted_hops)]


def normalise(text: str) -> str:
    return collapse_spaces(text.casefold())


def prompt_fingerprint(payload: dict[str, Any]) -> str | None:
    """A short hash of the normalised prompt (every message's text), or None if it has none."""
    texts = [normalise(t) for t in prompt_texts(payload)]
    if any(texts):
        data = "\x1f".join(texts).encode()
    elif isinstance(payload.get("prompt"), list) and payload["prompt"]:
        data = orjson.dumps(payload["prompt"])  # token arrays
    else:
        return None
    return hashlib.sha256(data).hexdigest()[:16]


def caller(ex: Exchange, ip: str | None) -> str:
    """The one a repeated-prompt block applies to: the tenant's user, or the client IP."""
    if ex.user:
        return f"{ex.tenant}/{ex.user}"
    return f"ip/{ip or 'unknown'}"


def plan(config: RateLimit, ex: Exchange, ip: str | None, fingerprint: str | None) -> Check:
    p, route = config.key_prefix, ex.route_path
    tier = config.tiers.get(ex.tier)  # type: ignore[call-overload]
    buckets: list[BucketSpec] = []
    if tier is not None:
        if tier.tenant is not None:
            key = tagged(p, "t", ex.tenant)
            buckets.append(BucketSpec("tenant", key, tier.tenant.rate, tier.tenant.burst))
        if tier.user is not None and ex.user:
            key = tagged(p, "u", ex.tenant, ex.user, route)
            buckets.append(BucketSpec("user", key, tier.user.rate, tier.user.burst))
        if tier.ip is not None and ip:
            buckets.append(BucketSpec("ip", tagged(p, "ip", ip), tier.ip.rate, tier.ip.burst))
    shared = config.routes.get(route)
    if shared is not None:
        buckets.append(BucketSpec("route", tagged(p, "r", route), shared.rate, shared.burst))
    repeat = None
    r = config.repeat
    if r.enabled and fingerprint:
        who = caller(ex, ip)
        info = orjson.dumps(
            {"tenant": ex.tenant, "tier": ex.tier, "prompt": fingerprint, "repeats": r.max_repeats + 1,
             "window_s": r.window_s}
        ).decode()
        # The arrivals and the block share the caller as hash tag: one slot, one script.
        repeat = RepeatSpec(
            key=f"{tagged(p, 'rep', who)}:{fingerprint}",
            block_key=block_key(p, who),
            limit=r.max_repeats,
            window=round(r.window_s * US),
            block=round(r.block_s * US),
            info=info,
        )
    return Check(tuple(buckets), repeat, f"{p}done:{ex.uid}")
