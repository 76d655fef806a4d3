"""Coalescing leases over a real Redis: one leader, waiters in the same process never poll,
waiters elsewhere are woken by the store's notice, exactly one waiter takes over a leader
that gave up, and a lease nobody learned of is handed back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from extproc.cache.lease import Claim, Leases
from extproc.cache.redis_store import RedisStore, scope_prefix
from extproc.cache.store import Lookup, Put
from extproc.config import CacheCoalesce
from extproc.metrics import Metrics
from extproc.redis_client import Client
from extproc.tasks import Tasks
from tests.services import guard
from tests.topology import SHARED, clean_client

S = "scope"


class Counting(RedisStore):
    """The real store, counting its lookups; `late_s` delays a lookup's reply after it ran."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.lookups = 0
        self.late_s = 0.0

    async def lookup(self, scope: str, key: str, token: str | None, lease_ms: int) -> Lookup:
        self.lookups += 1
        found = await super().lookup(scope, key, token, lease_ms)
        await asyncio.sleep(self.late_s)
        return found


@pytest.fixture(params=SHARED)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """A clean real Redis: one node, then a 6-node cluster (notices by sharded pub/sub)."""
    c = await clean_client(request, request.param)
    yield c
    await c.aclose()


def leases(store: RedisStore, client: Client, **coalesce: Any) -> Leases:
    metrics = Metrics()
    tasks = Tasks(metrics)
    return Leases(store, guard(metrics, client, op_timeout_ms=200), CacheCoalesce(**coalesce), metrics, tasks)


async def answer(coalescer: Leases, store: RedisStore, claim: Claim, key: str, body: bytes) -> None:
    assert claim.token is not None
    await store.put(Put(S, key, body, 60_000, 100, "t", "m", token=claim.token))
    await coalescer.finish(S, key, claim.token, body, stored=True)


async def test_waiters_in_one_process_share_one_lookup_and_the_answer(client: Client) -> None:
    store = Counting(client)
    coalescer = leases(store, client)
    claims = [asyncio.ensure_future(coalescer.claim(S, "k", lead=True, wait_s=10)) for _ in range(20)]
    await asyncio.sleep(0.1)
    leader = next(c.result() for c in claims if c.done())
    assert leader.role == "leader" and sum(c.done() for c in claims) == 1
    await answer(coalescer, store, leader, "k", b"the answer")
    rest = await asyncio.gather(*claims)
    assert sorted(c.role for c in rest) == ["hit"] * 19 + ["leader"]
    assert {c.entry for c in rest if c.role == "hit"} == {b"the answer"}
    assert all(c.coalesced for c in rest if c.role == "hit")
    assert store.lookups == 1  # the other 19 never asked Redis
    assert not coalescer.local


async def test_a_follower_elsewhere_is_woken_by_the_notice(client: Client) -> None:
    here, there = Counting(client), Counting(client)
    a = leases(here, client)
    # A follower that would not re-check the store for a minute: only the notice can wake it.
    b = leases(there, client, poll_ms=60_000, poll_max_ms=60_000)
    a.start()
    b.start()
    await asyncio.sleep(0.2)  # both subscribed
    leader = await a.claim(S, "k", lead=True, wait_s=5)
    follower = asyncio.ensure_future(b.claim(S, "k", lead=True, wait_s=20))
    await asyncio.sleep(0.2)
    assert not follower.done()
    await answer(a, here, leader, "k", b"from a")
    got = await asyncio.wait_for(follower, 10)
    assert (got.role, got.entry, got.coalesced) == ("hit", b"from a", True)
    assert there.lookups == 2  # the first look, and one after the notice
    await a.tasks.aclose()
    await b.tasks.aclose()


async def test_a_slow_leader_keeps_its_lease_past_its_length_and_stops_renewing_when_done(
    client: Client,
) -> None:
    here, there = Counting(client), Counting(client)
    a, b = leases(here, client, lease_s=0.3), leases(there, client, lease_s=0.3)
    leader = await a.claim(S, "k", lead=True, wait_s=5)
    assert leader.role == "leader" and leader.token is not None
    await asyncio.sleep(1.0)  # three lease lengths: renewed all along
    other = await b.claim(S, "k", lead=True, wait_s=0.05)  # another process: still led by `a`
    assert other.role == "upstream" and other.coalesced
    await answer(a, here, leader, "k", b"slow answer")
    await asyncio.sleep(0.01)  # the cancelled renewal unwinds
    assert not a.tasks  # the renewal ended with the lead
    got = await b.claim(S, "k", lead=True, wait_s=1)
    assert (got.role, got.entry) == ("hit", b"slow answer")
    await a.tasks.aclose()
    await b.tasks.aclose()


async def test_exactly_one_waiter_takes_over_a_leader_that_gave_up(client: Client) -> None:
    store = Counting(client)
    coalescer = leases(store, client)
    first = await coalescer.claim(S, "k", lead=True, wait_s=10)
    waiters = [asyncio.ensure_future(coalescer.claim(S, "k", lead=True, wait_s=10)) for _ in range(10)]
    await asyncio.sleep(0.05)
    assert first.token is not None
    await coalescer.finish(S, "k", first.token, None, stored=False)  # the upstream call failed
    await asyncio.sleep(0.1)
    new = [w.result() for w in waiters if w.done()]
    assert [c.role for c in new] == ["leader"]
    await answer(coalescer, store, new[0], "k", b"second try")
    rest = await asyncio.gather(*waiters)
    assert sorted(c.role for c in rest) == ["hit"] * 9 + ["leader"]


async def test_a_lease_whose_reply_came_too_late_is_handed_back(client: Client) -> None:
    store = Counting(client)
    coalescer = leases(store, client)
    store.late_s = 0.5  # over the 200 ms budget: the script ran, the gate gave up on it
    claim = await coalescer.claim(S, "k", lead=True, wait_s=10)
    assert claim.role == "unavailable"
    store.late_s = 0.0
    for _ in range(100):  # handed back in the background as soon as the store answers
        if not await client.exists(scope_prefix(S) + "l:k"):
            break
        await asyncio.sleep(0.02)
    assert not await client.exists(scope_prefix(S) + "l:k")
    assert (await coalescer.claim(S, "k", lead=True, wait_s=1)).role == "leader"


async def test_a_follower_elsewhere_is_woken_when_the_leader_hands_its_lease_back(client: Client) -> None:
    here, there = Counting(client), Counting(client)
    a = leases(here, client)
    b = leases(there, client, poll_ms=60_000, poll_max_ms=60_000)  # only a notice can wake it
    a.start()
    b.start()
    await asyncio.sleep(0.3)  # both subscribed
    leader = await a.claim(S, "k", lead=True, wait_s=5)
    assert leader.token is not None
    follower = asyncio.ensure_future(b.claim(S, "k", lead=True, wait_s=20))
    await asyncio.sleep(0.2)
    assert not follower.done()
    await a.finish(S, "k", leader.token, None, stored=False)  # the upstream call failed
    got = await asyncio.wait_for(follower, 5)
    assert got.role == "leader" and got.coalesced  # it took the lead at once, woken by the release
    await a.tasks.aclose()
    await b.tasks.aclose()


@pytest.mark.parametrize("cancel_after_s", [0.0, 0.05, 0.3])
async def test_a_request_cancelled_while_it_speaks_for_the_process_leaves_nothing_behind(
    client: Client, cancel_after_s: float
) -> None:
    """Cancelled during its store lookup (0 and 0.05 s: the reply is late) or while it follows a
    leader elsewhere (0.3 s): the key is free at once, its waiters take over, no lease is left."""
    store = Counting(client)
    coalescer = leases(store, client, lease_s=30)
    if cancel_after_s >= 0.3:  # a leader in another process holds the key
        other = leases(Counting(client), client)
        assert (await other.claim(S, "k", lead=True, wait_s=1)).role == "leader"
    else:
        store.late_s = 0.15  # late, yet within the store's time budget (200 ms)
    first = asyncio.ensure_future(coalescer.claim(S, "k", lead=True, wait_s=10))
    waiter = asyncio.ensure_future(coalescer.claim(S, "k", lead=True, wait_s=10))
    await asyncio.sleep(cancel_after_s)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    if cancel_after_s >= 0.3:
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not coalescer.local and len(coalescer.wakeups) == 0
        return
    store.late_s = 0.0
    claim = await asyncio.wait_for(waiter, 2)  # the waiter took over: no 10 s wait
    assert claim.role == "leader"
    await answer(coalescer, store, claim, "k", b"answer")
    assert not coalescer.local
    # The lease the cancelled lookup took was handed back: only the waiter's ever held it.
    assert await client.keys(scope_prefix(S) + "l:*") == []
    later = await asyncio.wait_for(coalescer.claim(S, "k", lead=True, wait_s=10), 1)
    assert later.role == "hit" and later.entry == b"answer"
