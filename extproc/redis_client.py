"""Build the Redis client of a topology: one node, a Sentinel-managed master, or a Cluster.

The client, not the gate, follows the topology. A Sentinel-managed pool asks the sentinels
for the master on every new connection and drops a connection that finds a replica, so a
promotion costs the calls that fail until the sentinels name the new master. A Cluster
client follows MOVED and ASK replies, refreshes its slot map after a failed call and
retries, so a slot moved live costs nothing and a master failover costs the calls made
before a replica is promoted.
"""

from __future__ import annotations

from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode as SyncClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError

from .redis_config import RedisTopology, host_port
from .redis_wire import FastRedis

# The request path's client; a RedisCluster offers the same commands (routed by key).
Client: TypeAlias = "aioredis.Redis | aioredis.RedisCluster"
# The socket's own limit only catches a connection that stopped answering; the budget of a
# call is enforced above it, per call (`StoreGuard`).
SOCKET_TIMEOUT_S = 2.0


def _tls(topology: RedisTopology) -> dict[str, Any]:
    tls = topology.tls
    if tls is None:
        return {}
    return {
        "ssl": True,
        "ssl_ca_certs": str(tls.ca_file) if tls.ca_file else None,
        "ssl_certfile": str(tls.cert_file) if tls.cert_file else None,
        "ssl_keyfile": str(tls.key_file) if tls.key_file else None,
        "ssl_check_hostname": tls.check_hostname,
    }


def _auth(topology: RedisTopology) -> dict[str, Any]:
    out: dict[str, Any] = {}
    password = topology.password()
    if password is not None:
        out["password"] = password
    if topology.username is not None:
        out["username"] = topology.username
    return out


def connect_topology(topology: RedisTopology, connect_timeout_s: float, request_path: bool = False) -> Client:
    """The asyncio client of `topology` (nothing is dialled until the first call). On the
    request path a single node over TCP gets `FastRedis`: its hot calls on a connection of
    their own (`redis_wire`)."""
    common: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": connect_timeout_s,
        "health_check_interval": 0,
        **_auth(topology),
        **_tls(topology),
    }
    if topology.mode == "cluster":
        nodes = [ClusterNode(*host_port(a)) for a in topology.nodes]
        # A failed call refreshes the slot map and is tried again, briefly: MOVED and ASK are
        # followed without counting as failures.
        return aioredis.RedisCluster(
            startup_nodes=nodes, retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 2), **common,
        )
    # After a restart or a promotion every idle pooled connection is dead and fails its next
    # command once; one immediate retry on a fresh connection (to the master the sentinels
    # name now) hides that. No retry on a time-out: a script that ran late must not run twice.
    once: dict[str, Any] = {"retry": Retry(NoBackoff(), 1), "retry_on_error": [RedisConnectionError],
                            "retry_on_timeout": False}
    if topology.mode == "sentinel":
        sentinel_auth: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": connect_timeout_s,
                                         **_tls(topology)}
        sentinel_password = topology.sentinel_password()
        if sentinel_password is not None:
            sentinel_auth["password"] = sentinel_password
        if topology.sentinel_username is not None:
            sentinel_auth["username"] = topology.sentinel_username
        sentinel = Sentinel(
            [host_port(a) for a in topology.sentinels], sentinel_kwargs=sentinel_auth, db=topology.db,
            **common, **once,
        )
        master: aioredis.Redis = sentinel.master_for(topology.master_name)
        return master
    assert topology.url is not None
    fast = request_path and urlsplit(topology.url).scheme == "redis"
    client: aioredis.Redis = (FastRedis if fast else aioredis.Redis).from_url(topology.url, **common, **once)
    return client  # the URL names the db


def connect_sync(topology: RedisTopology, timeout_s: float = 2.0) -> Any:
    """A blocking client of `topology`, for the command-line tools."""
    common: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
                              **_auth(topology), **_tls(topology)}
    if topology.mode == "cluster":
        seeds = [SyncClusterNode(*host_port(a)) for a in topology.nodes]  # type: ignore[no-untyped-call]
        return redis.RedisCluster(startup_nodes=seeds,
                                  **common)
    if topology.mode == "sentinel":
        from redis.sentinel import Sentinel as SyncSentinel

        password = topology.sentinel_password()
        kwargs: dict[str, Any] = {"socket_timeout": timeout_s, **_tls(topology)}
        if password is not None:
            kwargs["password"] = password
        sentinel = SyncSentinel(
            [host_port(a) for a in topology.sentinels], sentinel_kwargs=kwargs, db=topology.db, **common,
        )
        return sentinel.master_for(topology.master_name)
    assert topology.url is not None
    return redis.Redis.from_url(topology.url, **common)


def is_cluster(client: Any) -> bool:
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


async def ping(client: Client) -> None:
    """Raises unless the store answers: on a Cluster, every master of the slot map."""
    if isinstance(client, aioredis.RedisCluster):
        await client.ping(target_nodes=aioredis.RedisCluster.PRIMARIES)
    else:
        await client.ping()



