"""Admission: wait for a slot of the pool, in priority order, or be told to come back later.

On a miss only (after dedup): the request's class is its priority (never above the
tenant's tier), urgency words move it ahead within the class. The queue is the pool's
`llm-gate scheduler` when an address is configured, else one in this process. An
unreachable scheduler admits without queueing (counted). The slot is released exactly
once, in `on_done`, which runs however the exchange ends.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

from ..config import Config
from ..errors import error_reply
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..scheduler.client import RemoteScheduler
from ..scheduler.local import LocalScheduler
from ..scheduler.queue import Granted, Refused, Ticket
from ..scheduler.settings import Admission as Settings
from .base import Stage

QUEUE_MS_HEADER = "x-gate-queue-ms"


class Slots(Protocol):
    async def acquire(self, ticket: Ticket, prompt_tokens: int, tenant: str) -> Granted | Refused | None: ...
    async def release(self, id: str, tokens_used: int, latency_s: float, ok: bool) -> None: ...


class Embedded:
    """The in-process queue behind the same calls as the remote one."""

    def __init__(self, scheduler: LocalScheduler) -> None:
        self.scheduler = scheduler

    async def acquire(self, ticket: Ticket, prompt_tokens: int, tenant: str) -> Granted | Refused | None:
        await self.scheduler.start()
        return await self.scheduler.acquire(ticket, prompt_tokens)

    async def release(self, id: str, tokens_used: int, latency_s: float, ok: bool) -> None:
        self.scheduler.release(id)


def last_user_text(payload: dict[str, Any]) -> str:
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                return str(content or "")
        return ""
    prompt = payload.get("prompt")
    return prompt if isinstance(prompt, str) else " ".join(p for p in prompt or [] if isinstance(p, str))


def is_urgent(text: str, words: list[str]) -> bool:
    lowered = text.lower()
    return any(word.lower() in lowered for word in words)


def estimated_tokens(payload: dict[str, Any], prompt_tokens: int, default_max_tokens: int) -> int:
    out = payload.get("max_completion_tokens") or payload.get("max_tokens") or default_max_tokens
    n = payload.get("n") or 1
    return prompt_tokens + int(out) * int(n)


def overloaded(pool: str, outcome: Refused) -> Reply:
    eta_ms = max(1, round(outcome.eta_s * 1000))
    retry = max(1, math.ceil(outcome.eta_s))
    if outcome.reason in ("queue_full", "evicted"):
        why = "its queue is full"
    else:
        why = "no slot would be free before this request's wait budget ran out"
    return error_reply(
        503,
        f"Pool '{pool}' is overloaded: {why}. Retry after {retry} s; higher tiers are served first.",
        type="overloaded",
        code="overloaded",
        headers={"retry-after": str(retry)},
        decision="shed",
        extra={"eta_ms": eta_ms},
    )


class Admission(Stage):
    name = "admission"

    def __init__(self, settings: Settings, metrics: Metrics, workers: int = 1) -> None:
        self.settings = settings
        self.metrics = metrics
        self.workers = workers
        self.pools: dict[str, Slots] = {}
        self.embedded: dict[str, LocalScheduler] = {}
        self.held: dict[str, tuple[Slots, float]] = {}  # request id → (its slots, when granted)

    @classmethod
    def from_config(cls, config: Config, metrics: Metrics) -> Admission:
        return cls(config.admission, metrics, config.server.workers)

    def slots(self, pool: str) -> Slots:
        found = self.pools.get(pool)
        if found is None:
            s = self.settings
            address = s.pool(pool).scheduler
            if address:
                found = RemoteScheduler(
                    pool, address, self.metrics, s.scheduler_timeout_ms / 1000, s.lease_ms / 1000,
                    s.scheduler_tls,
                )
            else:
                local = LocalScheduler(
                    pool, s.policy(), s.pool(pool).capacity, self.metrics, share=1 / self.workers
                )
                self.embedded[pool] = local
                found = Embedded(local)
            self.pools[pool] = found
        return found

    async def aclose(self) -> None:
        for slots in self.pools.values():
            if isinstance(slots, Embedded):
                await slots.scheduler.stop()
            elif isinstance(slots, RemoteScheduler):
                await slots.close()

    def set_capacity_factor(self, pool: str, factor: float) -> None:
        """For the circuit breaker: admit only `factor` (0..1) of the pool's measured capacity.

        Applies to the embedded queue; a remote scheduler takes it through its own hook.
        """
        self.slots(pool)
        local = self.embedded.get(pool)
        if local is not None:
            local.set_capacity_factor(factor)

    async def on_request(self, ex: Exchange) -> Reply | None:
        if not self.settings.enabled or ex.pool is None or ex.payload is None:
            return None
        s = self.settings
        cls = ex.priority
        ticket = Ticket(
            id=ex.request_id,
            cls=cls,
            urgent=is_urgent(last_user_text(ex.payload), s.urgency_words),
            tokens=estimated_tokens(ex.payload, ex.prompt_tokens, s.default_max_tokens),
            deadline_s=s.deadline_s(cls),
        )
        slots = self.slots(ex.pool)
        started = time.perf_counter()
        outcome = await slots.acquire(ticket, ex.prompt_tokens, ex.tenant)
        waited = time.perf_counter() - started
        if outcome is None:
            self.metrics.admission.labels(ex.pool, "fail_open").inc()
            return None
        if isinstance(outcome, Refused):
            self.metrics.admission.labels(ex.pool, "shed").inc()
            return overloaded(ex.pool, outcome)
        self.held[ex.request_id] = (slots, time.perf_counter())
        self.metrics.admission.labels(ex.pool, "granted").inc()
        self.metrics.admission_wait.labels(cls).observe(waited)
        ex.client_headers[QUEUE_MS_HEADER] = str(round(waited * 1000))
        return None

    async def on_done(self, ex: Exchange) -> None:
        held = self.held.pop(ex.request_id, None)
        if held is None:
            return
        slots, granted_at = held
        ok = ex.status is not None and ex.status < 500
        await slots.release(ex.request_id, 0, time.perf_counter() - granted_at, ok)
