"""Transition notices by webhook: queued, retried with backoff, time-boxed, off the request path."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from ..config import Webhook
from ..metrics import Metrics
from ..tasks import Tasks

log = logging.getLogger("llm_gate.breaker.webhook")

MAX_IN_FLIGHT = 64  # notices being delivered at once; past that new ones are dropped (and counted)


def backoff_delays(retries: int, base_s: float, draw: Callable[[], float]) -> list[float]:
    """Exponential backoff with full jitter: attempt i waits up to base · 2^i."""
    return [base_s * 2**i * (0.5 + draw() / 2) for i in range(retries)]


class Notifier:
    def __init__(self, config: Webhook, metrics: Metrics, draw: Callable[[], float] = random.random) -> None:
        self.config = config
        self.metrics = metrics
        self.draw = draw
        self.tasks = Tasks(metrics)
        self._session: aiohttp.ClientSession | None = None

    def notify(self, payload: dict[str, Any]) -> None:
        """Schedule one notice and return at once."""
        if len(self.tasks) >= MAX_IN_FLIGHT:
            self.metrics.breaker_webhooks.labels("dropped").inc()
            return
        self.tasks.spawn(self.deliver(payload), "breaker_webhook")

    async def deliver(self, payload: dict[str, Any]) -> bool:
        body = orjson.dumps(payload)
        try:
            async with asyncio.timeout(self.config.deadline_s):
                for delay in [*backoff_delays(self.config.retries, self.config.backoff_s, self.draw), None]:
                    if await self._attempt(body):
                        self.metrics.breaker_webhooks.labels("delivered").inc()
                        return True
                    if delay is not None:
                        await asyncio.sleep(delay)
        except TimeoutError:
            pass
        self.metrics.breaker_webhooks.labels("failed").inc()
        log.warning("breaker webhook %s not delivered: %s", self.config.url, payload)
        return False

    async def _attempt(self, body: bytes) -> bool:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        headers = {"content-type": "application/json", **self.config.headers}
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        try:
            async with self._session.post(self.config.url, data=body, headers=headers, timeout=timeout) as r:
                return 200 <= r.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("breaker webhook attempt failed: %r", exc)
            return False

    async def close(self, wait_s: float = 1.0) -> None:
        """Give the notices in flight a moment, then cancel the rest."""
        await self.tasks.aclose(wait_s)
        if self._session is not None:
            await self._session.close()
