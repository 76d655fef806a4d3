"""The breaker's I/O shell for one gate process: every pool's window, state and sync loop.

Every `sync_interval_s` each process shares its new samples, adopts the shared state,
reads the merged window and runs `next_state`; a transition is written by
compare-and-set, and the process that wins it sends the webhook. With Redis down (or no
Redis configured) the process decides on its own samples and notifies on its own.

`subscribe` is the hook for admission (the adaptive limit): every tick each subscriber
gets each pool's `PoolHealth` (P95, error rate, throughput, state) and may shrink or
grow that pool's capacity from it. Callbacks must be quick and must not raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..config import Breaker as BreakerConfig
from ..metrics import Metrics
from ..redis_client import Client
from ..redis_conn import timeboxed
from ..tasks import Tasks, every
from . import shared
from .state import GAUGE, BreakerState, Evaluate, Phase, next_state, use_primary
from .webhook import Notifier
from .window import Stats, Window, summarize

log = logging.getLogger("llm_gate.breaker")
T = TypeVar("T")


@dataclass(frozen=True)
class PoolHealth:
    pool: str
    phase: Phase
    p95_s: float | None
    error_rate: float
    throughput: float  # completed upstream calls per second, all processes
    samples: int
    at: float


Subscriber = Callable[[PoolHealth], None]


@dataclass(frozen=True)
class Choice:
    primary: bool  # False: send to the pool's fallback
    probe: bool  # a HALF_OPEN request let through to the primary
    version: int  # the state this choice was made under; samples from older states are dropped


Waiting = Callable[[], float | None]  # seconds a call has waited for its first byte; None: not waiting


class PoolBreaker:
    def __init__(self, config: BreakerConfig, now: float) -> None:
        self.window = Window(config.window_s, config.slices)
        self.state = BreakerState(Phase.CLOSED, now, 0, "start")
        self.last_probe = -math.inf
        self.stats = Stats()
        self.in_flight: dict[str, tuple[int, Waiting]] = {}  # call id -> (state version, its wait)

    def waits(self) -> list[float]:
        """How long each call made under the current state has waited for its first byte."""
        version = self.state.version
        ages = (wait() for v, wait in self.in_flight.values() if v == version)
        return [age for age in ages if age is not None]


class Breakers:
    def __init__(
        self,
        config: BreakerConfig,
        pools: Iterable[str],
        metrics: Metrics,
        redis: Client | None = None,
        *,
        clock: Callable[[], float] = time.time,
        draw: Callable[[], float] = random.random,
        notifier: Notifier | None = None,
        tasks: Tasks | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.redis = redis
        self.clock = clock
        self.draw = draw
        self.notifier = (
            notifier
            if notifier is not None
            else (Notifier(config.webhook, metrics) if config.webhook else None)
        )
        now = clock()
        self.pools = {name: PoolBreaker(config, now) for name in pools}
        self.subscribers: list[Subscriber] = []
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.tasks = tasks if tasks is not None else Tasks(metrics)
        self._task: asyncio.Task[None] | None = None
        for name, pb in self.pools.items():
            metrics.breaker_state.labels(name).set(GAUGE[pb.state.phase])

    def subscribe(self, callback: Subscriber) -> None:
        self.subscribers.append(callback)

    # -- the request path: no I/O ------------------------------------------------------

    def choose(self, pool: str) -> Choice:
        pb = self.pools[pool]
        now = self.clock()
        primary = use_primary(pb.state, self.draw(), now, pb.last_probe, self.config)
        probe = primary and pb.state.phase is Phase.HALF_OPEN
        if probe:
            pb.last_probe = now
        return Choice(primary, probe, pb.state.version)

    def version(self, pool: str) -> int:
        return self.pools[pool].state.version

    def begin(self, pool: str, call_id: str, version: int, waiting: Waiting) -> None:
        """A call went to `pool`: until `end`, the sync loop watches how long it waits."""
        pb = self.pools.get(pool)
        if pb is not None:
            pb.in_flight[call_id] = (version, waiting)

    def end(self, pool: str, call_id: str) -> None:
        pb = self.pools.get(pool)
        if pb is not None:
            pb.in_flight.pop(call_id, None)

    def _overdue(self, name: str, pb: PoolBreaker) -> list[float]:
        waits = pb.waits()
        self.metrics.breaker_oldest_wait.labels(name).set(max(waits, default=0.0))
        return [age for age in waits if age > self.config.open_p95_s]

    def record(self, pool: str, version: int, latency_s: float | None, error: bool) -> None:
        pb = self.pools.get(pool)
        if pb is None or version != pb.state.version:
            return
        pb.window.add(self.clock(), latency_s, error)

    # -- the background loop -------------------------------------------------------------

    def start(self) -> None:
        """Start the sync loop in the running event loop (once)."""
        if self._task is None or self._task.done():
            self._task = self.tasks.spawn(self.run(), "breaker_sync")

    async def run(self) -> None:
        await every(self.config.sync_interval_s, self.sync_once, self.metrics, "breaker_sync")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.notifier is not None:
            await self.notifier.close()

    async def sync_once(self) -> None:
        for name in self.pools:
            await self._sync_pool(name)

    async def _store(self, call: Awaitable[T], op: str) -> tuple[bool, T | None]:
        """(True, value), or (False, None) when Redis failed or is not configured."""

        async def wrapped() -> tuple[bool, T | None]:
            return True, await call

        timeout = self.config.sync_timeout_ms / 1000
        return await timeboxed(wrapped(), (False, None), timeout, self.metrics, f"breaker_{op}")

    async def _sync_pool(self, name: str) -> None:
        pb, cfg, redis = self.pools[name], self.config, self.redis
        now = self.clock()
        stats: Stats | None = None
        overdue = self._overdue(name, pb)
        if redis is not None:
            stats = await self._sync_shared(name, pb, redis, now, overdue)
        if stats is None:
            stats = pb.window.stats(now, pb.state.since, overdue)
        pb.stats = stats
        new = next_state(pb.state, Evaluate(stats), now, cfg)
        if new.version == pb.state.version:
            pb.state = new
        elif redis is None:
            self._transition(name, pb, new, stats, announce=True)
        else:
            ok, won = await self._store(
                shared.write_state(redis, cfg.key_prefix, name, pb.state.version, new), "cas"
            )
            if not ok or won:
                self._transition(name, pb, new, stats, announce=True)
            else:
                ok, remote = await self._store(shared.read_state(redis, cfg.key_prefix, name), "state")
                if ok and remote is not None:
                    self._transition(name, pb, remote, stats, announce=False)
        self._observe(name, pb, now)

    async def _sync_shared(
        self, name: str, pb: PoolBreaker, redis: Client, now: float, overdue: list[float]
    ) -> Stats | None:
        """Share new samples, adopt the shared state, return the merged window (None: Redis failed)."""
        cfg, window = self.config, pb.window
        pending = window.take_pending()
        ttl = math.ceil(cfg.window_s + 2 * window.width + 10)
        ok, _ = await self._store(shared.push(redis, cfg.key_prefix, name, pending, ttl), "push")
        if not ok:
            window.restore_pending(pending, now)
            return None
        ok, remote = await self._store(shared.read_state(redis, cfg.key_prefix, name), "state")
        if not ok:
            return None
        if remote is None or remote.version < pb.state.version:
            # Fresh Redis, or we moved on while it was away: publish what we know.
            expected = -1 if remote is None else remote.version
            await self._store(shared.write_state(redis, cfg.key_prefix, name, expected, pb.state), "cas")
        elif remote.phase is pb.state.phase:
            pb.state = replace(remote, healthy_since=pb.state.healthy_since)  # align `since` and version
        else:
            self._transition(name, pb, remote, pb.stats, announce=False)
        ok, slices = await self._store(
            shared.read_slices(redis, cfg.key_prefix, name, window.span(now, pb.state.since)), "window"
        )
        if not ok or slices is None:
            return None
        return summarize(slices, window.covered_s(now, pb.state.since), overdue)

    def _transition(
        self, name: str, pb: PoolBreaker, new: BreakerState, stats: Stats, *, announce: bool
    ) -> None:
        old = pb.state
        pb.state = new
        self.metrics.breaker_transitions.labels(name, old.phase.value, new.phase.value).inc()
        self.metrics.breaker_state.labels(name).set(GAUGE[new.phase])
        log.warning(
            "breaker %s: %s → %s (%s)%s",
            name,
            old.phase.value,
            new.phase.value,
            new.reason,
            "" if announce else " [adopted]",
        )
        if announce and self.notifier is not None:
            self.notifier.notify(self.payload(name, old, new, stats))

    def payload(self, name: str, old: BreakerState, new: BreakerState, stats: Stats) -> dict[str, Any]:
        return {
            "pool": name,
            "old_state": old.phase.value,
            "new_state": new.phase.value,
            "reason": new.reason,
            "p95_s": stats.p95_s,
            "error_rate": stats.error_rate,
            "samples": stats.samples,
            "window_s": self.config.window_s,
            "version": new.version,
            "at": new.since,
            "gate": self.identity,
        }

    def _observe(self, name: str, pb: PoolBreaker, now: float) -> None:
        stats = pb.stats
        self.metrics.breaker_state.labels(name).set(GAUGE[pb.state.phase])
        self.metrics.breaker_p95.labels(name).set(stats.p95_s if stats.p95_s is not None else math.nan)
        self.metrics.breaker_error_rate.labels(name).set(stats.error_rate)
        health = PoolHealth(
            name, pb.state.phase, stats.p95_s, stats.error_rate, stats.throughput, stats.samples, now
        )
        for callback in self.subscribers:
            try:
                callback(health)
            except Exception:
                log.exception("breaker subscriber failed")
