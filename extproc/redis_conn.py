"""Redis access shared by every stage: one client per process, every call time-boxed.

Fail open: a store call that errors or takes longer than `op_timeout_ms` returns the
caller's default and is counted in `gate_store_errors_total`; the request goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from .config import Store
from .metrics import Metrics

T = TypeVar("T")
log = logging.getLogger("llm_gate.redis")


def connect(config: Store) -> aioredis.Redis | None:
    if config.redis_url is None:
        return None
    timeout = max(config.op_timeout_ms / 1000, 0.001)
    return aioredis.Redis.from_url(
        config.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=max(timeout, 0.05),
        retry_on_timeout=False,
        health_check_interval=0,
        # After a Redis restart every idle pooled connection is dead and fails its next
        # command once; one immediate retry on a fresh connection hides that.
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError],
    )


async def timeboxed(call: Awaitable[T], default: T, timeout_s: float, metrics: Metrics, op: str) -> T:
    """Await `call` for at most `timeout_s`; on any store failure return `default`.

    `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` can swallow a cancellation
    that races the result, and a background loop then never stops.
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except (RedisError, OSError, TimeoutError) as exc:
        metrics.store_errors.labels(op, type(exc).__name__).inc()
        log.debug("store call %s failed: %r", op, exc)
        return default
