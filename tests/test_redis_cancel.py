"""A request cancelled while its Redis command is in flight sees the cancellation: the gate's
clean-up on cancel (leases handed back, waiters woken) depends on it. redis-py 8 answers a
cancelled command with None instead; every store call of the request path goes through
`StoreGuard.run`, which raises the cancellation the client swallowed."""

from __future__ import annotations

import asyncio

import pytest

from extproc.metrics import Metrics
from extproc.redis_client import connect_topology
from extproc.redis_config import RedisTopology
from load.stack import RedisServer
from tests.services import guard


@pytest.mark.parametrize("request_path", [False, True], ids=["redis-py", "wire"])
def test_a_cancelled_store_call_raises_cancelled_error(request_path: bool) -> None:
    async def run(url: str) -> list[str]:
        client = connect_topology(RedisTopology(url=url), 1.0, request_path=request_path)
        await client.ping()  # a pooled, established connection: the case that went wrong
        store = guard(Metrics(), client, op_timeout_ms=500)
        outcomes = []
        for _ in range(5):
            task = asyncio.ensure_future(store.run(client.mget(["key"]), "default", "get"))
            await asyncio.sleep(0)
            task.cancel()
            try:
                outcomes.append(f"returned {await task!r}")
            except asyncio.CancelledError:
                outcomes.append("cancelled")
        assert await store.run(client.mget(["key"]), "default", "get") == [None]  # still works after
        await client.aclose()
        return outcomes

    server = RedisServer().start()
    try:
        assert asyncio.run(run(server.url)) == ["cancelled"] * 5
    finally:
        server.kill()
