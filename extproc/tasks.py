"""Background tasks of one gate process: each one kept, its failure counted, all stopped together.

A bare `create_task` whose result nobody reads can be garbage-collected mid-flight and
loses its exception; every background task of the gate goes through `Tasks.spawn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from .metrics import Metrics

log = logging.getLogger("llm_gate.tasks")


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

    async def aclose(self) -> None:
        running = list(self._running)
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
