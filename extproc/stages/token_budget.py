"""TokenBudget: tokens per minute per tenant, reserved before admission, reconciled after.

A request reserves prompt + max_tokens; 429 with OpenAI's `x-ratelimit-*-tokens` headers
when the tenant's budget cannot cover it. A failed answer gives everything back; a 2xx
gives back what its `usage` shows unused (JSON body, or the last SSE usage frame, which
vLLM sends when the client asked for `stream_options.include_usage`). A failing store
skips the budget for that request (fail open, counted).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import Config
from ..errors import error_reply, unavailable_reply
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..ratelimit.gcra import US, Decision
from ..redis_conn import StoreGuard
from ..request import estimated_tokens
from ..scheduler.budget import Budget, BudgetStore
from ..scheduler.settings import Admission
from .base import Stage, closed_when_store_down, payload_of

if TYPE_CHECKING:
    from ..services import Services
from .ratelimit import duration

TAIL_BYTES = 16_384  # the usage object sits at the end of a body or stream
_USAGE = re.compile(rb'"total_tokens"\s*:\s*(\d+)')


def used_tokens(tail: bytes) -> int | None:
    """total_tokens of the last usage object in the body's tail, if any."""
    found = _USAGE.findall(tail)
    return int(found[-1]) if found else None


def limit_headers(budget: Budget, decision: Decision) -> dict[str, str]:
    return {
        "x-ratelimit-limit-tokens": str(budget.per_minute),
        "x-ratelimit-remaining-tokens": str(decision.remaining),
        "x-ratelimit-reset-tokens": duration(decision.reset_after),
    }


def ask_for_usage(ex: Exchange) -> None:
    """Make a stream end with its usage chunk, so its reservation can be reconciled."""
    payload = ex.payload
    if payload is None or not payload.get("stream"):
        return
    options = payload.get("stream_options") or {}
    if options.get("include_usage"):
        return
    payload["stream_options"] = {**options, "include_usage": True}
    ex.payload_changed = True


@dataclass
class Reserved:
    """One request's reservation, and the tail of its answer once it streams back."""

    budget: Budget
    cost: int
    tail: bytes | None = None


class TokenBudget(Stage):
    name = "token_budget"
    fail_closed = True
    store_down = "skipped, or 503 where configured"  # token_budget.fail_closed_paths / _tiers

    def __init__(
        self, settings: Admission, store: BudgetStore, metrics: Metrics, guard: StoreGuard,
        prefix: str = "gate:tb:",
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.guard = guard
        self.prefix = prefix

    @classmethod
    def build(cls, config: Config, services: Services) -> TokenBudget:
        return cls(config.admission, services.budgets, services.metrics, services.store)

    def runs(self, hook: str) -> bool:
        return bool(self.settings.token_budget.tokens_per_minute)

    def budget_for(self, tenant: str) -> Budget | None:
        per_tenant = self.settings.token_budget.tokens_per_minute
        per_minute = per_tenant.get(tenant, per_tenant.get("*"))
        return None if per_minute is None else Budget(self.prefix + tenant, per_minute)

    async def on_request(self, ex: Exchange) -> Reply | None:
        budget = self.budget_for(ex.tenant)
        if budget is None:
            return None
        cost = estimated_tokens(payload_of(ex), ex.prompt_tokens, self.settings.default_max_tokens)
        decision = await self.guard.run(self.store.take(budget, cost), None, "token_budget")
        if decision is None:
            tb = self.settings.token_budget
            if not closed_when_store_down(ex.route_path, ex.tier, tb.fail_closed_paths, tb.fail_closed_tiers):
                self.metrics.token_budget.labels("skipped").inc()
                return None
            self.metrics.token_budget.labels("unavailable").inc()
            return unavailable_reply("The token budget", "token_budget_unavailable", "budget_unavailable")
        headers = limit_headers(budget, decision)
        if decision.allowed:
            self.metrics.token_budget.labels("allowed").inc()
            ex.state[self.name] = Reserved(budget, cost)
            ex.client_headers.update(headers)
            if self.settings.token_budget.inject_include_usage:
                ask_for_usage(ex)
            return None
        self.metrics.token_budget.labels("limited").inc()
        retry = max(1, math.ceil(decision.retry_after / US))
        if cost > budget.per_minute:
            why = f"this request alone needs {cost} tokens (prompt + max_tokens); lower max_tokens"
        else:
            why = f"it needs {cost} tokens and {decision.remaining} are left; retry in {retry} s"
        return error_reply(
            429,
            f"Token budget of tenant '{ex.tenant}' reached ({budget.per_minute} tokens per minute): {why}.",
            type="tokens",
            code="rate_limit_exceeded",
            headers={**headers, "retry-after": str(retry)},
            decision="budget",
        )

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        held = ex.state.get(self.name)
        if not isinstance(held, Reserved):
            return
        if status >= 300:
            await self._give_back(ex, held, None)
        elif self.settings.token_budget.reconcile:
            ex.capture_body = True
            held.tail = b""

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        held = ex.state.get(self.name)
        if not isinstance(held, Reserved) or held.tail is None:
            return
        held.tail = (held.tail + chunk)[-TAIL_BYTES:]
        if end:
            used = used_tokens(held.tail)
            if used is None:  # no usage in the answer: the reservation stands
                ex.state.pop(self.name, None)
            else:
                await self._give_back(ex, held, used)

    async def _give_back(self, ex: Exchange, held: Reserved, used: int | None) -> None:
        """Return all of a reservation (used None on a failure) or its unused part."""
        ex.state.pop(self.name, None)
        unused = held.cost if used is None else held.cost - used
        if unused > 0:
            await self.guard.run(self.store.give_back(held.budget, unused), None, "token_budget")
