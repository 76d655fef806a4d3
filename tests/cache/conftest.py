"""Every cache store test gets a clean real Redis (restarted if a test killed it); `store` runs a
test on the in-process store and on Redis (test_store.py has its own, with the Cluster too)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from extproc.cache.redis_store import RedisStore
from extproc.cache.store import MemoryStore, Store
from extproc.redis_wire import FastRedis
from load.stack import RedisServer


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    if redis_server.proc is None:
        redis_server.start()
    client = FastRedis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    if server.proc is None:
        server.start()
    client = FastRedis.from_url(server.url)
    await client.flushall()
    yield RedisStore(client)
    await client.aclose()
