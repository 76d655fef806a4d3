"""Token budgets: tokens per minute per tenant, reserved at admission, reconciled after.

GCRA with a cost in tokens (`ratelimit.gcra.take_interval`): a request reserves
prompt + max_tokens; what the response's usage shows unused is given back. The memory
store runs the arithmetic here; the Redis store runs `budget.lua`, the same arithmetic,
atomically, so every gate replica draws on one budget per tenant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from ..ratelimit.gcra import Decision, interval_us, take_interval
from ..redis_client import Client

LUA = resources.files(__package__).joinpath("budget.lua").read_text(encoding="utf-8")


def wall_clock_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Budget:
    """One tenant's bucket: `per_minute` tokens, refilled continuously."""

    key: str
    per_minute: int

    @property
    def interval(self) -> int:
        return interval_us(self.per_minute / 60)

    @property
    def tolerance(self) -> int:
        return self.per_minute * self.interval


def refund(state: int | None, now: int, interval: int, tokens: int) -> int:
    """The TAT after giving `tokens` back; never earlier than now (a bucket is at most full)."""
    tat = now if state is None or state < now else state
    return max(now, tat - tokens * interval)


class BudgetStore(Protocol):
    async def take(self, budget: Budget, cost: int, now: int | None = None) -> Decision: ...

    async def give_back(self, budget: Budget, tokens: int, now: int | None = None) -> None: ...


class MemoryBudgets:
    def __init__(self, clock: Callable[[], int] = wall_clock_us) -> None:
        self.clock = clock
        self.tats: dict[str, int] = {}

    async def take(self, budget: Budget, cost: int, now: int | None = None) -> Decision:
        now = self.clock() if now is None else now
        decision = take_interval(self.tats.get(budget.key), now, budget.interval, budget.tolerance, cost)
        if decision.state is not None:
            self.tats[budget.key] = decision.state
        return decision

    async def give_back(self, budget: Budget, tokens: int, now: int | None = None) -> None:
        now = self.clock() if now is None else now
        self.tats[budget.key] = refund(self.tats.get(budget.key), now, budget.interval, tokens)


class RedisBudgets:
    def __init__(self, redis: Client, clock: Callable[[], int] = wall_clock_us) -> None:
        self.clock = clock
        self.script = redis.register_script(LUA)

    async def _run(self, budget: Budget, cost: int, now: int | None) -> list[int]:
        now = self.clock() if now is None else now
        reply = await self.script(keys=[budget.key], args=[now, budget.interval, budget.tolerance, cost])
        return [int(x) for x in reply]

    async def take(self, budget: Budget, cost: int, now: int | None = None) -> Decision:
        allowed, remaining, retry_after, reset_after = await self._run(budget, cost, now)
        return Decision(bool(allowed), None, remaining, retry_after, reset_after)

    async def give_back(self, budget: Budget, tokens: int, now: int | None = None) -> None:
        await self._run(budget, -tokens, now)
