"""Every cache store test gets a clean real Redis (restarted if a test killed it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from load.stack import RedisServer


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    if redis_server.proc is None:
        redis_server.start()
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()
