"""RateLimit: GCRA buckets per tenant, user, client IP and route, and the repeated-prompt block.

Runs after validation and before anything costly. A store that fails or is slow skips the
limits for that request (counted in `gate_store_errors_total{op="ratelimit"}`), except on
the paths the operator marked fail-closed, which get a 503. A store that is up but slow is
waited for within `store.op_timeout_ms` (see `redis_conn.StoreGuard`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..config import Config
from ..config import RateLimit as RateLimitConfig
from ..errors import error_reply, unavailable_reply
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..ratelimit.check import Verdict
from ..ratelimit.gcra import US, Decision
from ..ratelimit.keys import client_ip, plan, prompt_fingerprint
from ..ratelimit.store import LimitStore
from ..redis_conn import StoreGuard
from .base import Stage, closed_when_store_down, payload_of

if TYPE_CHECKING:
    from ..services import Services

LIMIT = "x-ratelimit-limit-requests"
REMAINING = "x-ratelimit-remaining-requests"
RESET = "x-ratelimit-reset-requests"


def duration(us: int) -> str:
    """OpenAI's style for x-ratelimit-reset-*: `20ms`, `1.5s`, `6m0s`."""
    if us < US:
        return f"{math.ceil(us / 1000)}ms"
    seconds = us / US
    if seconds < 60:
        return f"{math.ceil(seconds * 1000) / 1000:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def quota_headers(burst: int, decision: Decision) -> dict[str, str]:
    return {LIMIT: str(burst), REMAINING: str(decision.remaining), RESET: duration(decision.reset_after)}


def retry_headers(wait_us: int) -> dict[str, str]:
    """`retry-after` in whole seconds (HTTP), `retry-after-ms` for clients that read it (OpenAI's)."""
    return {
        "retry-after": str(max(1, math.ceil(wait_us / US))),
        "retry-after-ms": str(math.ceil(wait_us / 1000)),
    }


class RateLimit(Stage):
    name = "ratelimit"
    fail_closed = True  # a limit that breaks must not let the request through unchecked
    store_down = "skipped, or 503 where configured"  # ratelimit.fail_closed_paths / _tiers

    def __init__(
        self, config: RateLimitConfig, store: LimitStore, metrics: Metrics, guard: StoreGuard
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.guard = guard

    @classmethod
    def build(cls, config: Config, services: Services) -> RateLimit:
        return cls(config.ratelimit, services.limits, services.metrics, services.store)

    def runs(self, hook: str) -> bool:
        return self.config.enabled

    async def on_request(self, ex: Exchange) -> Reply | None:
        if not self.config.enabled:
            return None
        payload = payload_of(ex)
        ip = client_ip(ex.headers, self.config.trusted_hops)
        # the fingerprint is a pass over the whole prompt: only when the repeat block needs it
        fingerprint = prompt_fingerprint(payload) if self.config.repeat.enabled else None
        check = plan(self.config, ex, ip, fingerprint)
        if not check.buckets and check.repeat is None:
            return None
        verdict = await self.guard.run(self.store.check(check), None, "ratelimit")
        if verdict is None:
            return self._store_down(ex)
        index = verdict.tightest()
        spec = check.buckets[index] if index is not None else None
        limit = spec.name if spec is not None else "repeat"
        self.metrics.ratelimit_decisions.labels(verdict.status, limit, ex.tier).inc()
        if verdict.status == "blocked":
            return self._blocked(ex, verdict)
        if spec is None or index is None:
            return None  # only the repeat check ran, and it let the request through
        decision = verdict.decisions[index]
        headers = quota_headers(spec.burst, decision)
        if verdict.status == "allowed":
            ex.client_headers.update(headers)
            return None
        per = "the route" if spec.name == "route" else f"this {spec.name}"
        message = (
            f"Rate limit reached for requests per {spec.name} ({ex.tier} tier) on {ex.route_path}: "
            f"{spec.burst} at once, {spec.rate:g} per second for {per}. "
            f"Try again in {duration(decision.retry_after)}."
        )
        return error_reply(
            429,
            message,
            type="rate_limit_exceeded",
            code="rate_limit_exceeded",
            headers={**headers, **retry_headers(decision.retry_after)},
            decision="ratelimited",
        )

    def _blocked(self, ex: Exchange, verdict: Verdict) -> Reply:
        if verdict.newly_blocked:
            self.metrics.ratelimit_blocks.labels(ex.tier).inc()
        r = self.config.repeat
        message = (
            f"Blocked for sending the same prompt more than {r.max_repeats} times in {r.window_s:g}s. "
            f"Try again in {duration(verdict.block_left)}; an operator can lift the block sooner."
        )
        return error_reply(
            429,
            message,
            type="rate_limit_exceeded",
            code="repeated_prompt_blocked",
            headers=retry_headers(verdict.block_left),
            decision="blocked",
        )

    def _store_down(self, ex: Exchange) -> Reply | None:
        c = self.config
        closed = closed_when_store_down(ex.route_path, ex.tier, c.fail_closed_paths, c.fail_closed_tiers)
        result = "unavailable" if closed else "skipped"
        self.metrics.ratelimit_decisions.labels(result, "store", ex.tier).inc()
        if not closed:
            return None
        return unavailable_reply("The rate limit", "ratelimit_unavailable", "ratelimit_unavailable")
