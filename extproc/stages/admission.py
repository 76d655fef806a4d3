"""Admission: wait for a slot of the pool, in priority order, or be told to come back later.

On a miss only (after dedup): the request's class is its priority (never above the
tenant's tier), urgency words move it ahead within the class. The queue is the pool's
`llm-gate scheduler` when an address is configured, else one in this process. An
unreachable scheduler admits without queueing (counted). The slot is released exactly
once, in `on_done`, which runs however the exchange ends. On a pool whose vLLM schedules
by priority (`preempt_slots`), the body's `priority` is set from the class, so the vip
requests granted over the limit start at once by preempting lower-class work.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..errors import error_reply
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..request import client_timeout_s, estimated_tokens, last_user_text, wants_stream
from ..scheduler.pools import Pools, Slots
from ..scheduler.queue import CLASSES, Refused, Ticket
from ..scheduler.settings import Admission as Settings
from .base import Stage, payload_of

if TYPE_CHECKING:
    from ..services import Services

QUEUE_MS_HEADER = "x-gate-queue-ms"
CLIENT_TIMEOUT_SHARE = 0.5  # of the client's timeout, at most, in the queue: the rest is for the model


@dataclass(frozen=True)
class Held:
    """A granted slot, released exactly once when the exchange ends."""

    slots: Slots
    granted_at: float


def is_urgent(text: str, words: list[str]) -> bool:
    lowered = text.lower()
    return any(word.lower() in lowered for word in words)


def wait_budget_s(class_deadline_s: float, headers: dict[str, str]) -> float:
    """How long this request may queue: its class's deadline, and never past the point where
    its client gives up (OpenAI's SDKs send their read timeout as x-stainless-read-timeout):
    a slot granted after that would compute an answer nobody reads, and the client's retry
    would queue again."""
    client_s = client_timeout_s(headers)
    if client_s is None:
        return class_deadline_s
    return min(class_deadline_s, client_s * CLIENT_TIMEOUT_SHARE)


def answer_by_s(payload: dict[str, Any], headers: dict[str, str]) -> float | None:
    """When the client gives up on a whole JSON answer (its read timeout spans the model's
    whole run); None for a stream, whose first token is what the read timeout waits for."""
    return None if wants_stream(payload) else client_timeout_s(headers)


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
        headers={"retry-after": str(retry), "retry-after-ms": str(eta_ms)},
        decision="shed",
        extra={"eta_ms": eta_ms},
    )


class Admission(Stage):
    name = "admission"
    fail_closed = False
    store_down = "not used"  # its queue is in-process or in the scheduler (down: admit unqueued)

    def __init__(self, settings: Settings, pools: Pools, metrics: Metrics) -> None:
        self.settings = settings
        self.pools = pools
        self.metrics = metrics

    @classmethod
    def build(cls, config: Config, services: Services) -> Admission:
        return cls(config.admission, services.pools, services.metrics)

    def runs(self, hook: str) -> bool:
        return self.settings.enabled

    async def on_request(self, ex: Exchange) -> Reply | None:
        if not self.settings.enabled or ex.pool is None:
            return None
        payload = payload_of(ex)
        s = self.settings
        cls = ex.priority
        ticket = Ticket(
            id=ex.uid,
            cls=cls,
            urgent=is_urgent(last_user_text(payload), s.urgency_words),
            tokens=estimated_tokens(payload, ex.prompt_tokens, s.default_max_tokens),
            deadline_s=wait_budget_s(s.deadline_s(cls), ex.headers),
            answer_by_s=answer_by_s(payload, ex.headers),
        )
        if s.pool(ex.pool).preempt_slots:
            payload["priority"] = CLASSES.index(cls) if cls in CLASSES else len(CLASSES) - 1
            ex.payload_changed = True
        slots = self.pools.slots(ex.pool)
        started = time.perf_counter()
        outcome = await slots.acquire(ticket, ex.prompt_tokens, ex.tenant)
        waited = time.perf_counter() - started
        if outcome is None:
            self.metrics.admission.labels(ex.pool, "fail_open").inc()
            return None
        if isinstance(outcome, Refused):
            self.metrics.admission.labels(ex.pool, "shed").inc()
            return overloaded(ex.pool, outcome)
        ex.state[self.name] = Held(slots, time.perf_counter())
        self.metrics.admission.labels(ex.pool, "granted").inc()
        self.metrics.admission_wait.labels(cls).observe(waited)
        ex.client_headers[QUEUE_MS_HEADER] = str(round(waited * 1000))
        ex.waited_s += waited
        return None

    async def on_done(self, ex: Exchange) -> None:
        held = ex.state.pop(self.name, None)
        if not isinstance(held, Held):
            return
        ok = ex.status is not None and ex.status < 500
        await held.slots.release(ex.uid, 0, time.perf_counter() - held.granted_at, ok)
