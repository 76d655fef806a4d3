"""The admission queues of one gate process, one per pool: embedded, or a remote scheduler.

A service: built with the process's config, closed on reload. The admission stage asks it
for a pool's slots; the breaker's adaptive limit shrinks a pool's capacity through it.
"""

from __future__ import annotations

from typing import Protocol

from ..metrics import Metrics
from .client import RemoteScheduler
from .local import LocalScheduler
from .queue import Granted, Refused, Ticket
from .settings import Admission as Settings


class Slots(Protocol):
    async def acquire(self, ticket: Ticket, prompt_tokens: int, tenant: str) -> Granted | Refused | None: ...
    async def release(self, id: str, tokens_used: int, latency_s: float, ok: bool) -> None: ...


class Embedded:
    """The in-process queue behind the same calls as the remote one."""

    def __init__(self, scheduler: LocalScheduler) -> None:
        self.scheduler = scheduler

    async def acquire(self, ticket: Ticket, prompt_tokens: int, tenant: str) -> Granted | Refused | None:
        return await self.scheduler.acquire(ticket, prompt_tokens)

    async def release(self, id: str, tokens_used: int, latency_s: float, ok: bool) -> None:
        self.scheduler.release(id)


class Pools:
    def __init__(
        self, settings: Settings, metrics: Metrics, workers: int = 1, names: list[str] | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.workers = workers
        self.names = names or []  # the pools to start with the process
        self._slots: dict[str, Slots] = {}
        self.embedded: dict[str, LocalScheduler] = {}

    async def start(self) -> None:
        """Every named pool's queue, its timers and capacity readings running before the first
        request (a pool first named later starts when it is first asked for)."""
        for name in self.names:
            self.slots(name)
        for local in self.embedded.values():
            await local.start()

    def slots(self, pool: str) -> Slots:
        found = self._slots.get(pool)
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
                    pool, s.policy(pool), s.pool(pool).capacity, self.metrics, share=1 / self.workers
                )
                self.embedded[pool] = local
                found = Embedded(local)
            self._slots[pool] = found
        return found

    def set_capacity_factor(self, pool: str, factor: float) -> None:
        """For the circuit breaker: admit only `factor` (0..1) of the pool's measured capacity.

        Applies to the embedded queue; a remote scheduler takes it through its own hook.
        """
        self.slots(pool)
        local = self.embedded.get(pool)
        if local is not None:
            local.set_capacity_factor(factor)

    async def aclose(self) -> None:
        for slots in self._slots.values():
            if isinstance(slots, Embedded):
                await slots.scheduler.stop()
            elif isinstance(slots, RemoteScheduler):
                await slots.close()
