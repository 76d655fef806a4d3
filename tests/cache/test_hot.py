"""The process's hot copy of exact entries: bounded, short-lived, answered without a store
call, and emptied by a purge on every process that shares the store."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from extproc.cache.entry import Entry
from extproc.cache.hot import HotEntries, Purged
from extproc.cache.purge import purge_from
from extproc.cache.redis_store import RedisStore
from extproc.cache.store import MemoryStore, Store
from extproc.redis_wire import FastRedis
from extproc.stages.cache import Cache
from load.stack import RedisServer
from tests.topology import SHARED, clean_client

from .helpers import Upstream, cache_stage, chat, config, send


def entry(text: str = "q", *, tenant: str = "acme", model: str = "m1", age_s: float = 0.0) -> Entry:
    return Entry("json", '{"a": 1}', (), text, model, tenant, time.time() - age_s)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_until_its_own_ttl_or_the_cap_whichever_comes_first() -> None:
    clock = Clock()
    hot = HotEntries(1 << 20, ttl_s=60, clock=clock)
    hot.put("s.fresh", entry(), 100, ttl_s=3600)
    hot.put("s.old", entry(age_s=3590), 100, ttl_s=3600)  # 10 s of its hour left
    hot.put("s.gone", entry(age_s=4000), 100, ttl_s=3600)  # expired in the store already
    assert hot.get("s.gone") is None and len(hot) == 2
    clock.now += 11
    assert hot.get("s.old") is None and hot.get("s.fresh") is not None
    clock.now += 50
    assert hot.get("s.fresh") is None and len(hot) == 0 and hot.bytes == 0


def test_bounded_by_bytes_the_least_recently_used_go_first() -> None:
    hot = HotEntries(1000, ttl_s=60)
    for name in "abcd":
        hot.put(f"s.{name}", entry(name), 120, ttl_s=3600)
    assert hot.get("s.a") is not None  # a is now the most recent
    for name in "efghijk":
        hot.put(f"s.{name}", entry(name), 120, ttl_s=3600)
    assert hot.bytes <= 1000
    assert hot.get("s.a") is not None and hot.get("s.b") is None and hot.get("s.k") is not None
    hot.put("s.huge", entry("huge"), 200, ttl_s=3600)  # over an eighth of the bytes: not kept
    assert hot.get("s.huge") is None


def test_a_purge_drops_what_it_names_and_travels_as_a_notice() -> None:
    hot = HotEntries(1 << 20, ttl_s=60)
    hot.put("s1.a", entry(tenant="acme", model="m1"), 10, ttl_s=3600)
    hot.put("s1.b", entry(tenant="acme", model="m2"), 10, ttl_s=3600)
    hot.put("s2.c", entry(tenant="globex", model="m1"), 10, ttl_s=3600)
    hot.put("s2.d", entry(tenant="globex", model="m2"), 10, ttl_s=3600)
    for purged in (Purged(scope="s2", key="d"), Purged(tenant="acme", model="m2"), Purged(model="m1")):
        assert Purged.from_notice(purged.notice()) == purged
        hot.purge(purged)
    assert len(hot) == 0
    assert Purged.from_notice("abc.def") is None  # an ordinary notice: a slot
    hot.put("s1.a", entry(), 10, ttl_s=3600)
    hot.purge(Purged())  # nothing named: everything
    assert len(hot) == 0


def hot_stage(store: Store, client: aioredis.Redis | None = None) -> Cache:
    hot = HotEntries(1 << 20, ttl_s=60)
    store.on_purge(hot.purge)
    stage = cache_stage(config(), store, None, client=client, hot=hot)
    stage.b.leases.start()  # listens to the store's notices (Redis)
    return stage


def local_hits(stage: Cache) -> float:
    return stage.b.metrics.cache_local_hits._value.get()  # type: ignore[no-any-return]


async def lookups(client: aioredis.Redis) -> int:
    """Scripts the Redis server ran so far (every cache lookup is one)."""
    stats = await client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


async def test_a_repeat_is_answered_from_the_hot_copy_without_a_store_call(store: Store) -> None:
    stage, up = hot_stage(store), Upstream()
    first = await send(stage, chat("What is the capital of France?"), up)
    client = store.client if isinstance(store, RedisStore) else None
    before = await lookups(client) if client is not None else 0
    again = await send(stage, chat("what is the capital of  France?"), up)
    assert (first.cache, again.cache, again.headers["x-gate-cache-match"]) == ("miss", "hit", "exact")
    assert again.text() == first.text() and up.calls == 1 and local_hits(stage) == 1
    if client is not None:
        assert await lookups(client) == before
    # A purge drops it at once here: the next request asks the model again.
    assert await store.purge(tenant="acme") == 1
    for _ in range(100):
        if stage.b.hot is not None and not len(stage.b.hot):
            break
        await asyncio.sleep(0.02)
    third = await send(stage, chat("What is the capital of France?"), up)
    assert (third.cache, up.calls) == ("miss", 2)
    assert stage.b.tasks is not None
    await stage.b.tasks.aclose(1.0)


async def test_a_purge_from_anywhere_reaches_every_process(redis_server: RedisServer) -> None:
    if redis_server.proc is None:
        redis_server.start()
    clients = [FastRedis.from_url(redis_server.url) for _ in range(3)]
    await clients[0].flushall()
    gates = [hot_stage(RedisStore(c), c) for c in clients[:2]]
    await asyncio.sleep(0.2)  # both listening
    up = Upstream()
    for gate in gates * 2:
        await send(gate, chat("Where is my parcel?"), up)
    assert up.calls == 1 and [local_hits(g) for g in gates] == [1, 1]
    # The operator's purge (`llm-gate cache-purge --tenant acme`) talks to Redis, not to a gate.
    assert await purge_from(RedisStore(clients[2]), "acme", None, None) == 1
    for _ in range(100):
        if all(g.b.hot is not None and not len(g.b.hot) for g in gates):
            break
        await asyncio.sleep(0.02)
    assert [len(g.b.hot or []) for g in gates] == [0, 0]
    again = await send(gates[1], chat("Where is my parcel?"), up)
    assert (again.cache, up.calls) == ("miss", 2)
    # A subscription that broke may have missed a purge: everything kept is dropped.
    await send(gates[0], chat("Where is my parcel?"), up)
    assert gates[0].b.hot is not None and len(gates[0].b.hot) == 1
    await clients[2].client_kill_filter(_type="pubsub")
    for _ in range(150):
        if not len(gates[0].b.hot):
            break
        await asyncio.sleep(0.02)
    assert len(gates[0].b.hot) == 0
    for g in gates:
        if g.b.tasks is not None:
            await g.b.tasks.aclose(1.0)
    for c in clients:
        await c.aclose()


@pytest.mark.parametrize("kind", ["memory", *SHARED])
async def test_every_subscriber_hears_of_a_purge(request: pytest.FixtureRequest, kind: str) -> None:
    """On a cluster too: the notice goes out on one sharded channel, which every gate hears."""
    heard: list[Purged] = []
    if kind == "memory":
        store: Store = MemoryStore()
        other: Store = store
    else:
        client, admin = await clean_client(request, kind), await clean_client(request, kind)
        store, other = RedisStore(client), RedisStore(admin)
    store.on_purge(heard.append)
    redis = isinstance(store, RedisStore)
    listening = asyncio.ensure_future(store.listen(lambda slot: None)) if redis else None
    try:
        for _ in range(100):  # subscribed: told "everything" once
            if heard or listening is None:
                break
            await asyncio.sleep(0.02)
        heard.clear()
        await other.purge(tenant="acme")
        await other.purge(scope="s1", key="k1")
        for _ in range(150):
            if len(heard) == 2:
                break
            await asyncio.sleep(0.02)
        assert heard == [Purged(tenant="acme"), Purged(scope="s1", key="k1")]
    finally:
        if listening is not None:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
            for s in (store, other):
                assert isinstance(s, RedisStore)
                await s.client.aclose()
