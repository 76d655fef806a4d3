"""The versions' I/O shell for one gate process: windows, shared rollout state, its loop.

The request path only calls `record` (no I/O). Every `version_sync.interval_s` the loop
shares each version's new samples, reads the model's rollout state, runs `next_rollout`
on the merged windows of canary and stable since the step began, and writes a change by
compare-and-set: the process that wins it logs it, counts it and (for a rollback) sends
the breaker's webhook; every other process adopts it on its next tick. Without Redis the
process decides alone, on its own samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..breaker.webhook import Notifier
from ..breaker.window import Slice, Stats, Window, summarize
from ..config import Routing
from ..metrics import Metrics
from ..redis_client import Client
from ..redis_conn import timeboxed
from ..tasks import Tasks, every
from . import shared
from .rollout import RolloutState, begin, next_rollout
from .settings import Rollout, VersionedModel
from .traffic import Traffic

log = logging.getLogger("llm_gate.versions")
T = TypeVar("T")


class VersionMonitor:
    def __init__(
        self,
        routing: Routing,
        traffic: Traffic,
        metrics: Metrics,
        redis: Client | None = None,
        notifier: Notifier | None = None,
        *,
        clock: Callable[[], float] = time.time,
        tasks: Tasks | None = None,
    ) -> None:
        self.routing = routing
        self.sync = routing.version_sync
        self.traffic = traffic
        self.metrics = metrics
        self.redis = redis
        self.notifier = notifier
        self.clock = clock
        self.tasks = tasks if tasks is not None else Tasks(metrics)
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.windows: dict[tuple[str, str], Window] = {}
        for name, model in self.watched().items():
            cfg = model.rollout or Rollout()
            for v in model.versions:
                self.windows[(name, v.name)] = Window(cfg.window_s, cfg.slices)
        self._task: asyncio.Task[None] | None = None

    def watched(self) -> dict[str, VersionedModel]:
        """Models with a canary: the ones whose weight can be stepped, set or rolled back."""
        return {name: m for name, m in self.routing.versions.items() if m.canary is not None}

    # -- the request path: no I/O --------------------------------------------------------

    def record(self, model: str, version: str, latency_s: float | None, error: bool) -> None:
        window = self.windows.get((model, version))
        if window is not None:
            window.add(self.clock(), latency_s, error)

    # -- the background loop -------------------------------------------------------------

    def start(self) -> None:
        if self.windows and (self._task is None or self._task.done()):
            self._task = self.tasks.spawn(self.run(), "versions_sync")

    async def run(self) -> None:
        await every(self.sync.interval_s, self.sync_once, self.metrics, "versions_sync")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.notifier is not None:
            await self.notifier.close()
        if self.redis is not None:
            await self.redis.aclose()

    async def sync_once(self) -> None:
        for name, model in self.watched().items():
            await self._sync_model(name, model)

    async def _store(self, call: Awaitable[T], op: str) -> tuple[bool, T | None]:
        async def wrapped() -> tuple[bool, T | None]:
            return True, await call

        timeout = self.sync.timeout_ms / 1000
        return await timeboxed(wrapped(), (False, None), timeout, self.metrics, f"versions_{op}")

    async def _sync_model(self, name: str, model: VersionedModel) -> None:
        canary = model.canary
        assert canary is not None
        now = self.clock()
        current = self.traffic.shared.get(name)
        if self.redis is not None:
            await self._push(name, model, now)
            read = shared.read_state(self.redis, self.sync.key_prefix, name)
            ok, remote = await self._store(read, "state")
            if not ok:
                return  # Redis away: keep routing by the last state seen
            if remote is None and current is not None and current.canary == canary.name:
                # A fresh or flushed Redis: publish what we know rather than start over (a
                # rolled-back canary must stay at 0).
                write = shared.write_state(self.redis, self.sync.key_prefix, name, -1, current)
                await self._store(write, "cas")
                return
            self._adopt(name, remote)
            current = remote
        expected = current.version if current is not None else -1
        if current is not None and current.canary != canary.name:
            current = None  # a state about an earlier canary: ignored by the table, replaced here
        if current is None:
            if model.rollout is not None:
                fresh = begin(canary.name, model.rollout, now, expected + 1)
                await self._propose(name, expected, fresh, None)
            return
        if current.phase != "rolling" or model.rollout is None:
            return
        canary_stats, stable_stats = await self._stats(name, model, current, now)
        new = next_rollout(current, canary_stats, stable_stats, now, model.rollout)
        if new is not current:
            await self._propose(name, current.version, new, (canary_stats, stable_stats))

    async def _push(self, name: str, model: VersionedModel, now: float) -> None:
        assert self.redis is not None
        for v in model.versions:
            window = self.windows[(name, v.name)]
            pending = window.take_pending()
            if not pending:
                continue
            ttl = math.ceil(window.window_s + 2 * window.width + 10)
            ok, _ = await self._store(
                shared.push(self.redis, self.sync.key_prefix, name, v.name, pending, ttl), "push"
            )
            if not ok:
                window.restore_pending(pending, now)

    async def _stats(
        self, name: str, model: VersionedModel, state: RolloutState, now: float
    ) -> tuple[Stats, Stats]:
        """Canary and stable (every other version together) over the step's window."""
        canary_parts: list[Slice] = []
        stable_parts: list[Slice] = []
        covered = 0.0
        for v in model.versions:
            window = self.windows[(name, v.name)]
            span = window.span(now, state.since)
            covered = window.covered_s(now, state.since)
            parts = None
            if self.redis is not None:
                _, parts = await self._store(
                    shared.read_window(self.redis, self.sync.key_prefix, name, v.name, span), "window"
                )
            if parts is None:  # no Redis, or it failed: this process's own samples
                window.prune(now)
                parts = [window.slices[k] for k in span if k in window.slices]
            (canary_parts if v.canary else stable_parts).extend(parts)
        return summarize(canary_parts, covered), summarize(stable_parts, covered)

    async def _propose(
        self, name: str, expected: int, new: RolloutState, stats: tuple[Stats, Stats] | None
    ) -> None:
        if self.redis is None:
            self._adopt(name, new, origin="made", stats=stats)
            return
        write = shared.write_state(self.redis, self.sync.key_prefix, name, expected, new)
        ok, won = await self._store(write, "cas")
        if ok and won:
            self._adopt(name, new, origin="made", stats=stats)
            return
        ok, remote = await self._store(shared.read_state(self.redis, self.sync.key_prefix, name), "state")
        if ok:
            self._adopt(name, remote)

    def _adopt(
        self, name: str, state: RolloutState | None, *, origin: str = "adopted",
        stats: tuple[Stats, Stats] | None = None,
    ) -> None:
        old = self.traffic.shared.get(name)
        if state == old:
            return
        self.traffic.set_shared(name, state)
        if state is None:
            return
        self.metrics.rollout_changes.labels(name, state.phase, origin).inc()
        level = logging.WARNING if state.phase == "rolled_back" else logging.INFO
        log.log(level, "versions %s: canary %s at %g%% (%s, %s)%s", name, state.canary, state.weight,
                state.phase, state.reason, "" if origin == "made" else " [adopted]")
        if origin == "made" and state.phase == "rolled_back" and self.notifier is not None:
            self.notifier.notify(self.payload(name, old, state, stats))

    def payload(
        self, name: str, old: RolloutState | None, new: RolloutState, stats: tuple[Stats, Stats] | None
    ) -> dict[str, Any]:
        def describe(s: Stats | None) -> dict[str, Any] | None:
            if s is None:
                return None
            return {"p95_s": s.p95_s, "error_rate": s.error_rate, "samples": s.samples}

        return {
            "kind": "rollout",
            "model": name,
            "canary": new.canary,
            "new_state": new.phase,
            "old_weight": old.weight if old is not None else None,
            "weight": new.weight,
            "reason": new.reason,
            "canary_stats": describe(stats[0] if stats else None),
            "stable_stats": describe(stats[1] if stats else None),
            "version": new.version,
            "at": new.since,
            "gate": self.identity,
        }
