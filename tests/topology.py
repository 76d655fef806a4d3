"""Clients of the real Redis topologies the tests start (tests/conftest.py), by name.

`"redis"` is the single node, `"cluster"` the 6-node cluster; every client comes from the
gate's own `connect`, so the tests run the code path the gate runs. A store fixture
parametrized over `SHARED` runs its table against both.
"""

from __future__ import annotations

from typing import Any

import pytest

from extproc.config import Store
from extproc.redis_client import Client
from extproc.redis_conn import connect
from load.redis_topology import ClusterGroup
from load.stack import RedisServer

SHARED = ["redis", "cluster"]


def store_config(request: pytest.FixtureRequest, kind: str, **extra: Any) -> Store:
    if kind == "cluster":
        cluster: ClusterGroup = request.getfixturevalue("redis_cluster")
        return Store(redis=cluster.store_config(), **extra)
    server: RedisServer = request.getfixturevalue("redis_server")
    if server.proc is None:
        server.start()
    return Store(redis_url=server.url, **extra)


async def clean_client(request: pytest.FixtureRequest, kind: str, **extra: Any) -> Client:
    """A client of topology `kind` whose data was just flushed (every master of a cluster)."""
    client = connect(store_config(request, kind, **{"op_timeout_ms": 1000, **extra}))
    assert client is not None
    if kind == "cluster":
        await client.flushall(target_nodes="primaries")  # type: ignore[call-arg]
    else:
        await client.flushall()
    return client
