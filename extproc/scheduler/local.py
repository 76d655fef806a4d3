"""The queue of one pool, live: futures for waiters, a timer, and capacity refreshes.

Used by the scheduler service and, with no scheduler address configured, inside the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..metrics import Metrics
from ..tasks import Tasks
from .capacity import Limit, Reader, Reading, next_limit, scaled
from .queue import Demoted, Event, Expired, Granted, Policy, Queue, Refused, Ticket
from .settings import Capacity

log = logging.getLogger("llm_gate.scheduler")
SOURCES = ("nvml", "vllm", "static", "stale")


@dataclass(frozen=True)
class Status:
    pool: str
    limit: int
    in_flight: int
    queued: dict[str, int]
    oldest_wait_s: dict[str, float]
    queued_tokens: int
    source: str
    reading_age_s: float
    pressure: bool
    drain_per_s: float
    factor: float


class LocalScheduler:
    def __init__(
        self,
        pool: str,
        policy: Policy,
        capacity: Capacity,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        reader: Reader | None = None,
        share: float = 1.0,
    ) -> None:
        self.pool = pool
        self.queue = Queue(policy, limit=capacity.static_limit)
        self.settings = capacity
        self.metrics = metrics
        self.clock = clock
        self.reader = reader or Reader(capacity, clock)
        # Embedded in N gate processes, each takes 1/N of what the pool can hold.
        self.share = share
        self.factor = 1.0
        self.reading: Reading | None = None
        self.limit = Limit(capacity.static_limit, False, "static", 0.0)
        self._waiters: dict[str, asyncio.Future[Granted | Refused]] = {}
        self._prompt_tokens = 256.0
        self._wake = asyncio.Event()
        self._timer_due = math.inf  # when the timer wakes next on its own
        self._tasks = Tasks(metrics)
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.refresh()
            self._tasks.spawn(self._timer(), f"admission_timer_{self.pool}")
            self._tasks.spawn(self._refresher(), f"capacity_refresh_{self.pool}")

    async def stop(self) -> None:
        self._closed = True
        self._wake.set()
        await self._tasks.aclose()
        self._started = False
        await self.reader.close()

    # -- the API the service and the gate call --------------------------------------------

    async def acquire(self, ticket: Ticket, prompt_tokens: int = 0) -> Granted | Refused:
        """Wait for a grant or a refusal; cancelling the caller leaves the queue at once."""
        if prompt_tokens:
            self._prompt_tokens += 0.05 * (prompt_tokens - self._prompt_tokens)
        future: asyncio.Future[Granted | Refused] = asyncio.get_running_loop().create_future()
        self._waiters[ticket.id] = future
        try:
            self._apply(self.queue.offer(ticket, self.clock()))
            return await future
        except asyncio.CancelledError:
            now = self.clock()
            if not self.queue.cancel(ticket.id, now) and self.queue.release(ticket.id, now):
                self._apply(self.queue.poll(now))  # granted as the caller left: hand the slot on
            raise
        finally:
            self._waiters.pop(ticket.id, None)
            self._publish()

    def release(self, id: str) -> bool:
        """Give back a slot, or leave the queue; idempotent."""
        now = self.clock()
        done = self.queue.release(id, now) or self.queue.cancel(id, now)
        self._apply(self.queue.poll(now))
        self._publish()
        return done

    def renew(self, ids: list[str]) -> list[str]:
        return self.queue.renew(ids, self.clock())

    def set_capacity_factor(self, factor: float) -> None:
        """The hook for the circuit breaker's adaptive limit: a share (0..1) of measured capacity."""
        self.factor = min(1.0, max(0.0, factor))
        self._set_limit(self.limit)

    def status(self) -> Status:
        q, now = self.queue, self.clock()
        return Status(
            pool=self.pool,
            limit=q.limit,
            in_flight=len(q.held),
            queued=q.queued_by_class(),
            oldest_wait_s=q.oldest_wait_by_class(now),
            queued_tokens=q.queued_tokens,
            source=self.limit.source,
            reading_age_s=self.limit.age_s,
            pressure=q.pressure,
            drain_per_s=q.drain_per_s(now) or 0.0,
            factor=self.factor,
        )

    def eta_s(self, cls: str) -> float:
        return self.queue.eta_for(cls, self.clock())

    # -- the shell ------------------------------------------------------------------------

    def _apply(self, events: list[Event]) -> None:
        m, pool = self.metrics, self.pool
        for e in events:
            if isinstance(e, Granted | Refused):
                future = self._waiters.get(e.id)
                if future is not None and not future.done():
                    future.set_result(e)
                elif isinstance(e, Granted):  # its caller is gone: give the slot back
                    self.queue.release(e.id, self.clock())
            if isinstance(e, Granted):
                m.queue_grants.labels(pool, e.cls).inc()
                m.queue_wait.labels(pool, e.cls).observe(e.waited_s)
            elif isinstance(e, Refused):
                m.queue_sheds.labels(pool, e.cls, e.reason).inc()
            elif isinstance(e, Demoted):
                m.queue_demotions.labels(pool, e.asked).inc()
            elif isinstance(e, Expired):
                m.queue_lease_expiries.labels(pool).inc()
        self._nudge()

    def _nudge(self) -> None:
        """Wake the timer when it would sleep past something the change made due: anything while
        requests wait (deadlines, windows, rechecks), or a new grant's lease expiry before the
        timer's own wake-up. A slot granted and released at once (most requests) wakes nothing."""
        q = self.queue
        if q.waiting or self._timer_due > self.clock() + q.policy.lease_s:
            self._wake.set()

    def _publish(self) -> None:
        m, pool = self.metrics, self.pool
        for cls, count in self.queue.queued_by_class().items():
            m.queue_length.labels(pool, cls).set(count)
        m.queue_in_flight.labels(pool).set(len(self.queue.held))

    async def _timer(self) -> None:
        while not self._closed:
            now = self.clock()
            self._apply(self.queue.poll(now))
            self._publish()
            self._wake.clear()
            wake = self.queue.next_wakeup(self.clock())
            self._timer_due = math.inf if wake is None else wake
            timeout = None if wake is None else max(0.0005, wake - self.clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _refresher(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.settings.refresh_ms / 1000)
            try:
                await self.refresh()
            except Exception:
                log.exception("capacity refresh of pool %s failed", self.pool)

    async def refresh(self) -> None:
        reading = await self.reader.read(self._prompt_tokens)
        if reading is not None:
            self.reading = reading
        now = self.clock()
        in_flight = round(len(self.queue.held) / self.share)
        self._set_limit(next_limit(self.settings, self.reading, in_flight, self.limit, now))

    def _set_limit(self, limit: Limit) -> None:
        self.limit = limit
        effective = scaled(limit, self.factor)
        share = effective.limit if self.share >= 1 else max(1, int(effective.limit * self.share))
        probing = min(share, math.ceil(effective.probing * min(1.0, self.share)))
        self.queue.set_capacity(share if effective.limit else 0, effective.pressure, probing)
        m, pool = self.metrics, self.pool
        for source in SOURCES:
            m.pool_capacity.labels(pool, source).set(share if source == limit.source else 0)
        m.pool_reading_age.labels(pool).set(limit.age_s if limit.age_s != float("inf") else -1)
        m.pool_memory_used.labels(pool).set(limit.memory_used)
        self._apply(self.queue.poll(self.clock()))
