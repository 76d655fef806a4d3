"""Both stores against one table; the Lua script against the pure function; blocks admin."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.ratelimit.admin import main as blocks_cli
from extproc.ratelimit.check import BucketSpec, Check, RepeatSpec, Verdict
from extproc.ratelimit.slots import NOT_ASKED
from extproc.ratelimit.store import LimitStore, MemoryStore, RedisStore
from extproc.redis_wire import FastRedis
from load.stack import RedisServer
from tests.topology import SHARED, clean_client

from .cases import CASES, Expect, S


def summary(v: Verdict) -> Expect:
    buckets = tuple((d.allowed, d.remaining, d.retry_after, d.reset_after) for d in v.decisions)
    return Expect(v.status, buckets, v.block_left, v.newly_blocked)


@pytest.fixture(params=["memory", *SHARED])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LimitStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    client = await clean_client(request, request.param)
    yield RedisStore(client)
    await client.aclose()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_store_follows_the_table(store: LimitStore, name: str) -> None:
    for now, check, expect in CASES[name]:
        got = summary(await store.check(check, now))
        if isinstance(store, RedisStore) and store.by_slot and got.status == "limited":
            # Bucket by bucket (slots.py), the check stops at the first bucket that denies:
            # the ones after it are not asked and report nothing.
            unasked = (NOT_ASKED.allowed, NOT_ASKED.remaining, NOT_ASKED.retry_after, NOT_ASKED.reset_after)
            assert any(not b[0] for b in got.buckets)
            got = got._replace(buckets=tuple(
                e if g == unasked else g for g, e in zip(got.buckets, expect.buckets, strict=True)
            ))
        assert got == expect, (name, now)


async def test_blocks_are_listed_and_can_be_lifted(store: LimitStore) -> None:
    info = '{"tenant":"acme"}'
    rep = RepeatSpec("gate:rl:rep:{acme/u1}:p", "gate:rl:block:{acme/u1}", 1, S, 3600 * S, info)
    check = Check((), rep)
    assert (await store.check(check)).status == "allowed"
    assert (await store.check(check)).status == "blocked"
    [block] = await store.blocks()
    assert block.caller == "acme/u1" and block.info == '{"tenant":"acme"}'
    assert 3500 * S < block.left <= 3600 * S
    assert await store.lift("acme/u1")
    assert not await store.lift("acme/u1")
    assert await store.blocks() == []
    assert (await store.check(check)).status == "allowed"


@pytest.mark.parametrize("with_repeat", [False, True])
async def test_a_check_run_again_with_its_request_key_charges_nothing(
    store: LimitStore, with_repeat: bool
) -> None:
    """A retry after a lost reply (or a script that ran twice) gets the first verdict."""
    keys = ("gate:rl:rep:{acme/u1}:p", "gate:rl:block:{acme/u1}")
    rep = RepeatSpec(*keys, 5, S, 60 * S) if with_repeat else None
    bucket = (BucketSpec("tenant", "t:acme", 1, 3),)
    first = Check(bucket, rep, "gate:rl:done:req-1")
    verdicts = [await store.check(first, 10 * S) for _ in range(5)]
    assert {summary(v) for v in verdicts} == {summary(verdicts[0])}
    assert verdicts[0].decisions[0].remaining == 2
    other = await store.check(Check(bucket, rep, "gate:rl:done:req-2"), 10 * S)
    assert other.status == "allowed" and other.decisions[0].remaining == 1  # charged once per request


async def test_concurrent_checks_from_two_replicas_admit_exactly_the_burst(redis_server: RedisServer) -> None:
    """Any interleaving of 2 × 40 concurrent calls on one key, real Redis clock: burst 25 admits 25."""
    redis_server.flush()
    clients = [FastRedis.from_url(redis_server.url) for _ in range(2)]
    stores = [RedisStore(c) for c in clients]
    check = Check((BucketSpec("tenant", "shared", 0.5, 25),))  # refills 1 per 2 s: no refill in the test
    verdicts = await asyncio.gather(*(stores[i % 2].check(check) for i in range(80)))
    assert sum(v.status == "allowed" for v in verdicts) == 25
    for c in clients:
        await c.aclose()


# --- the Lua script and the pure function agree on random sequences -------------------------

KEYS = ["a", "b", "c"]
bucket = st.builds(
    BucketSpec,
    name=st.just("tenant"),
    key=st.sampled_from(KEYS),
    rate=st.sampled_from([0.5, 1, 3, 7, 100]),
    burst=st.integers(1, 6),
    cost=st.integers(1, 3),
)
# A key's window comes from the config, so it is the same on every call for that key
# (the memory store forgets a history by the window it was recorded with).
repeat = st.sampled_from([("r1", S // 2), ("r2", S)]).flatmap(
    lambda key_window: st.builds(
        RepeatSpec,
        key=st.just(key_window[0]),
        block_key=st.sampled_from(["b1", "b2"]),
        limit=st.integers(1, 4),
        window=st.just(key_window[1]),
        block=st.sampled_from([S // 3, 2 * S]),
        info=st.just("i"),
    )
)
check = st.builds(
    Check,
    buckets=st.lists(bucket, max_size=3, unique_by=lambda b: b.key).map(tuple),
    repeat=st.none() | repeat,
)
# Round gaps land exactly on window, interval and block boundaries, where off-by-ones hide.
gap = st.sampled_from([0, 1, S // 4, S // 3, S // 2, S]) | st.integers(0, 400_000)
steps = st.lists(st.tuples(gap, check), min_size=1, max_size=25)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(max_examples=150, deadline=None)
@given(steps=steps)
def test_lua_and_pure_agree_on_random_sequences(
    redis_server: RedisServer, loop: asyncio.AbstractEventLoop, steps: list[tuple[int, Check]]
) -> None:
    async def run() -> None:
        client = FastRedis.from_url(redis_server.url)
        prefix = uuid.uuid4().hex + ":"
        lua, pure = RedisStore(client), MemoryStore(sweep_every=1)  # sweeping must change nothing
        now = 1_700_000_000 * S  # wall-clock sized numbers, so %d and 2**53 matter
        try:
            for gap, c in steps:
                now += gap
                c = Check(
                    tuple(BucketSpec(b.name, prefix + b.key, b.rate, b.burst, b.cost) for b in c.buckets),
                    _prefixed(c.repeat, prefix),
                )
                assert summary(await lua.check(c, now)) == summary(await pure.check(c, now))
        finally:
            await client.aclose()

    loop.run_until_complete(run())


def _prefixed(rep: RepeatSpec | None, prefix: str) -> RepeatSpec | None:
    if rep is None:
        return None
    return RepeatSpec(prefix + rep.key, prefix + rep.block_key, rep.limit, rep.window, rep.block, rep.info)


def test_blocks_cli_lists_and_lifts(redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    async def block() -> None:
        client = FastRedis.from_url(redis_server.url)
        rep = RepeatSpec("gate:rl:rep:{ip/10.0.0.9}:p", "gate:rl:block:{ip/10.0.0.9}", 1, S, 60 * S)
        check = Check((), rep)
        store = RedisStore(client)
        await store.check(check)
        await store.check(check)
        await client.aclose()

    redis_server.flush()
    asyncio.run(block())
    assert blocks_cli(["list", "--redis", redis_server.url]) == 0
    assert "ip/10.0.0.9" in capsys.readouterr().out
    assert blocks_cli(["lift", "ip/10.0.0.9", "--redis", redis_server.url]) == 0
    assert blocks_cli(["lift", "ip/10.0.0.9", "--redis", redis_server.url]) == 1
    assert blocks_cli(["--redis", redis_server.url]) == 0
    assert "no blocks" in capsys.readouterr().out
