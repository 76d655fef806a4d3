"""The gate follows its store through a failover: a loop of cache, lease and rate-limit
operations keeps running while a real Sentinel master or Cluster master is SIGKILLed, or a
Cluster slot moves; operations resume within 5 s of the promotion, nothing is left behind."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from extproc.cache.lease import Leases
from extproc.cache.redis_store import RedisStore, scope_prefix
from extproc.cache.store import Put
from extproc.config import CacheCoalesce, Store
from extproc.exchange import new_id
from extproc.metrics import Metrics
from extproc.ratelimit.check import BucketSpec, Check
from extproc.ratelimit.store import RedisStore as Limits
from extproc.ratelimit.store import tagged
from extproc.redis_conn import StoreGuard, connect
from extproc.tasks import Tasks
from load.redis_topology import ClusterGroup, SentinelGroup, wait_until

SCOPE = "failover"
RESUME_S = 5.0


@dataclass
class Loop:
    """Store operations as the request path makes them, through one `StoreGuard`."""

    config: Store
    ops: list[tuple[float, bool]] = field(default_factory=list)  # (monotonic time, answered)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.metrics = Metrics()
        self.tasks = Tasks(self.metrics)
        self.client: Any = connect(self.config)
        self.guard = StoreGuard(self.client, self.config, self.metrics, self.tasks)
        self.answers = RedisStore(self.client)
        self.limits = Limits(self.client)
        self.leases = Leases(self.answers, self.guard, CacheCoalesce(lease_s=2.0), self.metrics, self.tasks)
        self.leases.start()

    async def one(self, i: int) -> bool:
        buckets = (BucketSpec("user", tagged("gate:rl:", "u", "acme", f"u{i % 7}", "/r"), 1000, 1000),
                   BucketSpec("tenant", tagged("gate:rl:", "t", "acme"), 1000, 1000))
        verdict = await self.guard.run(self.limits.check(Check(buckets, None, f"gate:rl:done:{new_id()}")),
                                       None, "ratelimit")
        key = f"k{i % 40}"
        claim = await self.leases.claim(SCOPE, key, lead=True, wait_s=1.0)
        if claim.role == "leader" and claim.token is not None:
            put = Put(SCOPE, key, b"answer", 2_000, 1000, "acme", "m", token=claim.token)
            stored = await self.guard.run(self._put(put), False, "cache_store")
            await self.leases.finish(SCOPE, key, claim.token, b"answer", stored=stored)
            return verdict is not None and stored
        return verdict is not None and claim.role in ("hit", "upstream")

    async def _put(self, put: Put) -> bool:
        await self.answers.put(put)
        return True

    async def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            ok = await self.one(i)
            self.ops.append((time.monotonic(), ok))
            i += 1
            await asyncio.sleep(0.005)

    def failures_after(self, t: float) -> list[float]:
        return [at for at, ok in self.ops if at >= t and not ok]

    async def aclose(self) -> None:
        await self.tasks.aclose()
        await self.guard.aclose()


async def run_through(loop: Loop, fault: Any, settle_s: float = 3.0) -> Any:
    """Run `loop` for 1 s, then `fault()` in a thread, then `settle_s` more; the fault's result."""
    runner = asyncio.ensure_future(loop.run())
    await asyncio.sleep(1.0)
    result = await asyncio.to_thread(fault)
    await asyncio.sleep(settle_s)
    loop.stop.set()
    await runner
    return result


async def no_lease_left(loop: Loop) -> None:
    """Every lease the loop took was handed back or stored with its answer: none outlives it."""
    assert not loop.leases.local  # no waiter or shared lookup of this process is left
    names: list[Any] = [n async for n in loop.client.scan_iter(match=f"gate:c:{{{SCOPE}}}:l:*")]
    assert names == []


async def test_sentinel_master_killed_the_gate_follows_the_promoted_replica(
    redis_sentinel: SentinelGroup,
) -> None:
    config = Store(redis=redis_sentinel.store_config(), op_timeout_ms=200, probe_interval_ms=200)
    loop = Loop(config)
    killed_at: list[float] = []
    killed: list[int] = []

    def fault() -> float:
        killed_at.append(time.monotonic())
        killed.append(redis_sentinel.kill_master())
        redis_sentinel.wait_promoted(killed[0])
        return time.monotonic()

    try:
        promoted_at = await run_through(loop, fault, settle_s=RESUME_S + 1)
        assert any(not ok for _, ok in loop.ops)  # the kill was felt: calls failed meanwhile
        late = loop.failures_after(promoted_at + RESUME_S)
        assert late == [], f"{len(late)} failed operations more than {RESUME_S} s after the promotion"
        assert loop.guard.up
        resumed = [at for at, ok in loop.ops if at > killed_at[0] and ok]
        assert resumed and resumed[0] <= promoted_at + RESUME_S
        await no_lease_left(loop)
    finally:
        await loop.aclose()
        for port in killed:  # back, as a replica of the new master
            await asyncio.to_thread(redis_sentinel.p.restart, port)


async def test_cluster_master_killed_the_gate_follows_the_promoted_replica(
    redis_cluster: ClusterGroup,
) -> None:
    config = Store(redis=redis_cluster.store_config(), op_timeout_ms=200, probe_interval_ms=200)
    loop = Loop(config)
    victim = redis_cluster.master_of(scope_prefix(SCOPE))  # the master of the cache scope's slot

    def fault() -> float:
        redis_cluster.kill(victim)
        wait_until(lambda: victim not in redis_cluster.masters() and len(redis_cluster.masters()) == 3, 20,
                   "a replica promoted")
        return time.monotonic()

    try:
        promoted_at = await run_through(loop, fault, settle_s=RESUME_S + 1)
        assert any(not ok for _, ok in loop.ops)
        late = loop.failures_after(promoted_at + RESUME_S)
        assert late == [], f"{len(late)} failed operations more than {RESUME_S} s after the promotion"
        assert loop.guard.up
        await no_lease_left(loop)
    finally:
        await loop.aclose()
        await asyncio.to_thread(redis_cluster.restart, victim)  # rejoins as a replica
        await asyncio.to_thread(redis_cluster.wait_ok)


async def test_a_cluster_slot_moved_under_load_costs_no_operation(redis_cluster: ClusterGroup) -> None:
    config = Store(redis=redis_cluster.store_config(), op_timeout_ms=500)
    loop = Loop(config)

    def fault() -> tuple[int, int, int]:
        return redis_cluster.migrate_slot_of(scope_prefix(SCOPE))

    try:
        slot, source, target = await run_through(loop, fault, settle_s=1.0)
        assert redis_cluster.master_of(scope_prefix(SCOPE)) == target != source
        failed = [at for at, ok in loop.ops if not ok]
        assert failed == [], f"{len(failed)} of {len(loop.ops)} operations failed while slot {slot} moved"
        assert loop.guard.up
        await no_lease_left(loop)
    finally:
        await loop.aclose()


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> None:
    for name in ("redis_sentinel", "redis_cluster"):
        if name in request.fixturenames:
            request.getfixturevalue(name).flush()
