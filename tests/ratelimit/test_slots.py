"""Buckets in different slots (Redis Cluster): each charged in its own slot, refunded when
another bucket denies the request. What that allows under concurrency, measured on a real
6-node cluster against the one-script check on a single node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from extproc.ratelimit.check import BucketSpec, Check, Verdict
from extproc.ratelimit.slots import part_key, slot_tag
from extproc.ratelimit.store import RedisStore, tagged
from extproc.redis_client import Client
from tests.topology import SHARED, clean_client

P = "gate:rl:"
TENANT = BucketSpec("tenant", tagged(P, "t", "acme"), 0.01, 20)  # refills 1 per 100 s: none in the test
USERS = [BucketSpec("user", tagged(P, "u", "acme", f"u{i}", "/v1/chat"), 0.01, 6) for i in range(5)]


@pytest.fixture(params=SHARED)
async def clients(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[Client]]]:
    """Two gate replicas' clients of one store."""
    first = await clean_client(request, request.param)
    second = await clean_client(request, request.param)
    yield request.param, [first, second]
    for c in (first, second):
        await c.aclose()


def test_keys_name_their_slot() -> None:
    assert slot_tag(TENANT.key) == "acme"
    assert slot_tag("gate:rl:u:{a%7Bb:u1:/r}") == "a%7Bb:u1:/r"
    assert slot_tag("plain") == "plain"
    assert part_key("gate:rl:done:req", TENANT.key) == "gate:rl:done:req:{acme}"
    with pytest.raises(ValueError):
        slot_tag("odd}key")


async def test_concurrent_requests_never_over_admit_and_denied_ones_cost_nothing(
    clients: tuple[str, list[Client]],
) -> None:
    """80 requests at once from 2 replicas, 5 users x 16, tenant burst 20, user burst 6.

    No bucket admits more than its burst (0 over-admission), on one node and on the cluster.
    On the cluster each user's bucket is asked first, so only the 30 requests its users had
    room for reach the tenant's, which admits exactly its 20; the 10 it denies are refunded
    to their users. Once everything settles every bucket holds exactly what it admitted.
    """
    _, (a, b) = clients
    stores = [RedisStore(a), RedisStore(b)]
    checks = [Check((TENANT, USERS[i % 5]), None, f"{P}done:r{i}") for i in range(80)]
    verdicts: list[Verdict] = await asyncio.gather(*(stores[i % 2].check(c) for i, c in enumerate(checks)))
    admitted = [c for c, v in zip(checks, verdicts, strict=True) if v.status == "allowed"]
    per_user = {u.key: sum(1 for c in admitted if c.buckets[1].key == u.key) for u in USERS}
    assert all(n <= 6 for n in per_user.values())  # no user's bucket over-admits
    assert len(admitted) == TENANT.burst  # nor the tenant's, and it is not left with room unused
    # Settled: each bucket was charged exactly for the requests it admitted.
    for bucket, took in [(TENANT, len(admitted)), *((u, per_user[u.key]) for u in USERS)]:
        probe = await stores[0].check(Check((bucket,), None, f"{P}done:probe:{bucket.key}"))
        left = bucket.burst - took
        assert (probe.status == "allowed") == (left > 0), bucket.key
        assert probe.decisions[0].remaining == max(0, left - 1), bucket.key


async def test_a_retried_check_is_charged_and_refunded_once(clients: tuple[str, list[Client]]) -> None:
    """A request denied by its user bucket, run three times (retries after lost replies)."""
    _, (a, _) = clients
    store = RedisStore(a)
    user = BucketSpec("user", tagged(P, "u", "acme", "solo", "/r"), 0.01, 1)
    await store.check(Check((user,), None, f"{P}done:fill"))  # the user's one request
    retried = Check((TENANT, user), None, f"{P}done:again")
    verdicts = [await store.check(retried) for _ in range(3)]
    assert {v.status for v in verdicts} == {"limited"}
    probe = await store.check(Check((TENANT,), None, f"{P}done:probe2"))
    assert probe.decisions[0].remaining == TENANT.burst - 1  # nothing kept from the denied request
