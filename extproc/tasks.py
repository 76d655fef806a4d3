"""Background tasks of one gate process: each one kept, its failure counted, all stopped together.

A bare `create_task` whose result nobody reads can be garbage-collected mid-flight and
loses its exception; every background task of the gate goes through `Tasks.spawn`, and
calls awaited together through `all_or_none`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from .metrics import Metrics

log = logging.getLogger("llm_gate.tasks")
CANCEL_ROUNDS = 20
CANCEL_WAIT_S = 0.25
T = TypeVar("T")


async def all_or_none(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's result, run together; when one fails, the others are cancelled before the
    failure is raised, so nothing a request started runs on for nobody."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


class Tasks:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._running: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.metrics.background_errors.labels(task.get_name()).inc()
            log.error("background task %s failed: %r", task.get_name(), exc, exc_info=exc)

    def __len__(self) -> int:
        return len(self._running)

    async def wait(self, timeout_s: float, name: str | None = None) -> None:
        """Until the running tasks (those called `name`, when given) end by themselves, at most
        `timeout_s`. At a close, work a request handed off (storing its answer) is let finish
        this way before the rest is cancelled."""
        running = [task for task in self._running if name is None or task.get_name() == name]
        if running:
            await asyncio.wait(running, timeout=timeout_s)

    async def aclose(self, wait_s: float = 0.0) -> None:
        """Give the running tasks `wait_s` to finish, then cancel the rest and wait for them."""
        running = list(self._running)
        if running and wait_s > 0:
            await asyncio.wait(running, timeout=wait_s)
        # A cancellation that lands as an `asyncio.timeout` inside the task expires is taken
        # for that time-out (Python 3.11): cancel again until every task has ended.
        for _ in range(CANCEL_ROUNDS):
            pending = [task for task in running if not task.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
        for task in running:
            if task.done():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    task.result()
            else:
                log.error("background task %s did not stop", task.get_name())


async def every(interval_s: float, step: Callable[[], Awaitable[None]], metrics: Metrics, name: str) -> None:
    """A background loop: `step` forever, `interval_s` apart; a step that fails is counted
    (`gate_background_errors_total{task=name}`) and logged, and the loop goes on."""
    while True:
        try:
            await step()
        except Exception:
            metrics.background_errors.labels(name).inc()
            log.exception("%s failed", name)
        await asyncio.sleep(interval_s)
