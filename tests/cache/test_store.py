"""One table of store behaviour, run against the in-process store and a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest

from extproc.cache.redis_store import RedisStore
from extproc.cache.store import MemoryStore, Pending, Put, Store
from tests.topology import SHARED, clean_client

S, T = "scope-a", "scope-b"


def vec(*values: float) -> bytes:
    return np.array(values, dtype=np.float32).tobytes()


def put(
    key: str,
    *,
    scope: str = S,
    ttl_ms: int = 60_000,
    max_entries: int = 100,
    tenant: str = "acme",
    model: str = "m1",
    vector: bytes | None = None,
    bands: tuple[str, ...] = (),
    token: str | None = None,
    band_cap: int = 64,
) -> Put:
    entry = f"entry-{key}".encode()
    return Put(scope, key, entry, ttl_ms, max_entries, tenant, model, vector, bands, token, band_cap)


async def lease_goes_to_the_first_and_only_the_first(store: Store) -> None:
    assert (await store.lookup(S, "k", "t1", 10_000)).role == "leader"
    assert (await store.lookup(S, "k", "t2", 10_000)).role == "follower"
    assert (await store.lookup(S, "k", None, 10_000)).role == "follower"  # only looks: someone leads
    assert (await store.lookup(S, "free", None, 10_000)).role == "none"
    assert (await store.lookup(T, "k", "t3", 10_000)).role == "leader"  # scopes are separate


async def lookup_is_idempotent_by_token(store: Store) -> None:
    """A lookup that ran twice (a retry after a lost reply) never makes a request follow itself."""
    assert (await store.lookup(S, "k", "t1", 10_000)).role == "leader"
    assert (await store.lookup(S, "k", "t1", 10_000)).role == "leader"
    assert (await store.lookup(S, "k", "t2", 10_000)).role == "follower"
    assert await store.release(S, "k", "t1")
    assert (await store.lookup(S, "k", "t2", 10_000)).role == "leader"


async def an_abandoned_attempt_is_noted_for_a_while(store: Store) -> None:
    assert await store.abandoned(S, "k") is None
    await store.abandon(S, "k", 1234, 60_000)
    assert await store.abandoned(S, "k") == 1234
    assert await store.abandoned(S, "other") is None and await store.abandoned(T, "k") is None
    await store.abandon(S, "gone", 5, 1)
    await asyncio.sleep(0.01)
    assert await store.abandoned(S, "gone") is None


async def stored_entry_is_a_hit_and_hands_back_the_lease(store: Store) -> None:
    await store.lookup(S, "k", "t1", 10_000)
    await store.put(put("k", token="t1"))
    found = await store.lookup(S, "k", "t2", 10_000)
    assert (found.role, found.entry) == ("hit", b"entry-k")
    assert not await store.release(S, "k", "t1")  # already handed back by the put
    assert await store.fetch(S, ["k", "nope"]) == [b"entry-k", None]


async def released_lease_goes_to_exactly_one_of_the_waiters(store: Store) -> None:
    await store.lookup(S, "k", "leader", 10_000)
    assert not await store.release(S, "k", "someone-else")
    assert (await store.lookup(S, "k", "w0", 10_000)).role == "follower"
    assert await store.release(S, "k", "leader")
    roles = await asyncio.gather(*(store.lookup(S, "k", f"w{i}", 10_000) for i in range(20)))
    assert sorted(r.role for r in roles).count("leader") == 1


async def concurrent_first_lookups_elect_one_leader(store: Store) -> None:
    roles = await asyncio.gather(*(store.lookup(S, "burst", f"t{i}", 10_000) for i in range(30)))
    assert [r.role for r in roles].count("leader") == 1
    assert [r.role for r in roles].count("follower") == 29


async def lease_expires_unless_renewed(store: Store) -> None:
    await store.lookup(S, "a", "ta", 150)
    await store.lookup(S, "b", "tb", 150)
    await asyncio.sleep(0.08)
    assert await store.renew(S, "b", "tb", 600)
    assert not await store.renew(S, "b", "wrong", 600)
    await asyncio.sleep(0.2)
    assert (await store.lookup(S, "a", "new", 1000)).role == "leader"  # the dead leader's lease ran out
    assert (await store.lookup(S, "b", "new", 1000)).role == "follower"


async def entry_expires_after_its_ttl(store: Store) -> None:
    await store.put(put("k", ttl_ms=150, vector=vec(1, 0), bands=("0:1",)))
    assert (await store.lookup(S, "k", None, 1000)).role == "hit"
    await asyncio.sleep(0.3)
    assert (await store.lookup(S, "k", None, 1000)).role == "none"
    assert await store.candidates(S, ["0:1"], 10) == []


async def candidates_share_a_band_and_carry_their_vector(store: Store) -> None:
    await store.put(put("a", vector=vec(1, 0), bands=("0:1", "1:1")))
    await store.put(put("b", vector=vec(0, 1), bands=("0:2", "1:1")))
    await store.put(put("c"))  # no vector: exact lookups only
    assert sorted(await store.candidates(S, ["0:1", "1:9"], 10)) == [("a", vec(1, 0))]
    assert sorted(await store.candidates(S, ["0:3", "1:1"], 10)) == [("a", vec(1, 0)), ("b", vec(0, 1))]
    assert await store.candidates(S, ["0:2", "1:1"], 1) == [("b", vec(0, 1))]  # shares two bands
    assert await store.candidates(S, ["0:1", "1:1"], 1) == [("a", vec(1, 0))]
    assert await store.candidates(T, ["0:1", "1:1"], 10) == []


async def storing_a_key_again_replaces_its_buckets(store: Store) -> None:
    await store.put(put("a", vector=vec(1, 0), bands=("0:1",)))
    await store.put(put("a", vector=vec(0, 1), bands=("0:2",)))
    assert await store.candidates(S, ["0:1"], 10) == []
    assert await store.candidates(S, ["0:2"], 10) == [("a", vec(0, 1))]


async def a_scope_keeps_at_most_max_entries(store: Store) -> None:
    for i in range(5):
        await store.put(put(f"k{i}", max_entries=3, ttl_ms=60_000 + i, vector=vec(1, 0), bands=("0:1",)))
    assert [await store.fetch(S, [f"k{i}"]) for i in range(5)] == [[None], [None]] + [
        [f"entry-k{i}".encode()] for i in (2, 3, 4)
    ]
    assert sorted(k for k, _ in await store.candidates(S, ["0:1"], 10)) == ["k2", "k3", "k4"]


async def a_full_scope_drops_by_the_latest_store_of_each_key(store: Store) -> None:
    """A key stored again counts from its last store; a purged key takes no room."""
    await store.put(put("a", ttl_ms=60_000, max_entries=3))
    await store.put(put("b", ttl_ms=61_000, max_entries=3))
    await store.put(put("c", ttl_ms=62_000, max_entries=3))
    await store.put(put("a", ttl_ms=63_000, max_entries=3))  # now the last to expire
    assert await store.purge(scope=S, key="c") == 1
    await store.put(put("d", ttl_ms=64_000, max_entries=3))
    assert await store.fetch(S, ["a", "b", "c", "d"]) == [b"entry-a", b"entry-b", None, b"entry-d"]
    await store.put(put("e", ttl_ms=65_000, max_entries=3))
    assert await store.fetch(S, ["a", "b", "d", "e"]) == [b"entry-a", None, b"entry-d", b"entry-e"]


async def a_full_bucket_keeps_the_entries_that_expire_last(store: Store) -> None:
    # Template traffic: every entry lands in bucket "0:hot"; each also has a bucket of its own.
    for i in range(6):
        await store.put(put(f"k{i}", ttl_ms=60_000 + 1000 * i, vector=vec(1, i), bands=("0:hot", f"1:{i}"),
                            band_cap=3))
    assert sorted(k for k, _ in await store.candidates(S, ["0:hot"], 10)) == ["k3", "k4", "k5"]
    # An entry pushed out of the full bucket is still found through its other bucket, and by key.
    assert await store.candidates(S, ["0:hot", "1:0"], 10) == [
        ("k0", vec(1, 0)), ("k3", vec(1, 3)), ("k4", vec(1, 4)), ("k5", vec(1, 5))
    ]
    assert await store.fetch(S, ["k0"]) == [b"entry-k0"]


async def dropping_an_entry_frees_its_place_in_a_full_bucket(store: Store) -> None:
    for i in range(3):
        await store.put(put(f"k{i}", ttl_ms=60_000 + 1000 * i, vector=vec(1, i), bands=("0:hot",),
                            band_cap=3))
    assert await store.purge(scope=S, key="k2") == 1
    await store.put(put("k3", ttl_ms=50_000, vector=vec(1, 3), bands=("0:hot",), band_cap=3))
    assert sorted(k for k, _ in await store.candidates(S, ["0:hot"], 10)) == ["k0", "k1", "k3"]


async def an_expired_entry_leaves_no_hole_in_a_full_bucket(store: Store) -> None:
    await store.put(put("short", ttl_ms=100, vector=vec(0, 1), bands=("0:hot",), band_cap=2))
    await store.put(put("a", vector=vec(1, 0), bands=("0:hot",), band_cap=2))
    await asyncio.sleep(0.25)
    await store.put(put("b", vector=vec(1, 1), bands=("0:hot",), band_cap=2))
    assert sorted(k for k, _ in await store.candidates(S, ["0:hot"], 10)) == ["a", "b"]


async def purge_by_tenant_model_or_key(store: Store) -> None:
    await store.put(put("a", scope="s1", tenant="acme", model="m1", vector=vec(1, 0), bands=("0:1",)))
    await store.put(put("b", scope="s1", tenant="acme", model="m1"))
    await store.put(put("c", scope="s2", tenant="acme", model="m2"))
    await store.put(put("d", scope="s3", tenant="globex", model="m1"))
    await store.put(put("e", scope="s4", tenant="globex", model="m2"))
    assert await store.purge(scope="s4", key="e") == 1
    assert await store.purge(scope="s4", key="e") == 0
    assert await store.purge(tenant="acme", model="m1") == 2
    assert await store.fetch("s1", ["a", "b"]) == [None, None]
    assert await store.candidates("s1", ["0:1"], 10) == []
    assert await store.purge(model="m1") == 1  # globex's
    assert await store.fetch("s2", ["c"]) == [b"entry-c"]
    assert await store.purge(tenant="acme") == 1
    assert await store.fetch("s2", ["c"]) == [None]


def pending(
    key: str, *, ttl_ms: int = 60_000, vector: bytes = b"", bands: tuple[str, ...] = ("0:1",)
) -> Pending:
    return Pending(S, key, f"question {key}", vector or vec(1, 0), bands, ttl_ms)


async def a_request_in_flight_is_a_candidate_until_its_answer_replaces_it(store: Store) -> None:
    await store.pend(pending("k", vector=vec(0, 1)))
    assert await store.candidates(S, ["0:1"], 10) == [("k", vec(0, 1))]
    assert await store.fetch(S, ["k"]) == [None]  # no answer yet
    assert await store.in_flight(S, ["k", "other"]) == ["question k", None]
    await store.put(put("k", vector=vec(1, 0), bands=("0:2",)))
    assert await store.in_flight(S, ["k"]) == [None]
    assert await store.candidates(S, ["0:1"], 10) == []  # the answer's own buckets replace it
    assert await store.candidates(S, ["0:2"], 10) == [("k", vec(1, 0))]


async def an_answered_key_is_not_announced_again_and_an_announcement_expires(store: Store) -> None:
    await store.put(put("done", vector=vec(1, 0), bands=("0:1",)))
    await store.pend(pending("done", vector=vec(0, 1), bands=("0:9",)))
    assert await store.in_flight(S, ["done"]) == [None]
    assert await store.candidates(S, ["0:9"], 10) == []
    await store.pend(pending("brief", ttl_ms=100, bands=("0:5",)))
    assert await store.in_flight(S, ["brief"]) == ["question brief"]
    await asyncio.sleep(0.25)
    assert await store.in_flight(S, ["brief"]) == [None]
    assert await store.candidates(S, ["0:5"], 10) == []


CASES: list[Callable[[Store], Awaitable[None]]] = [
    a_request_in_flight_is_a_candidate_until_its_answer_replaces_it,
    an_answered_key_is_not_announced_again_and_an_announcement_expires,
    lease_goes_to_the_first_and_only_the_first,
    lookup_is_idempotent_by_token,
    an_abandoned_attempt_is_noted_for_a_while,
    stored_entry_is_a_hit_and_hands_back_the_lease,
    released_lease_goes_to_exactly_one_of_the_waiters,
    concurrent_first_lookups_elect_one_leader,
    lease_expires_unless_renewed,
    entry_expires_after_its_ttl,
    candidates_share_a_band_and_carry_their_vector,
    storing_a_key_again_replaces_its_buckets,
    a_scope_keeps_at_most_max_entries,
    a_full_scope_drops_by_the_latest_store_of_each_key,
    a_full_bucket_keeps_the_entries_that_expire_last,
    dropping_an_entry_frees_its_place_in_a_full_bucket,
    an_expired_entry_leaves_no_hole_in_a_full_bucket,
    purge_by_tenant_model_or_key,
]


@pytest.fixture(params=["memory", *SHARED])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    client = await clean_client(request, request.param)
    yield RedisStore(client)
    await client.aclose()


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
async def test_store_behaviour(store: Store, case: Callable[[Store], Awaitable[None]]) -> None:
    await case(store)


@pytest.mark.parametrize("kind", SHARED)
async def test_a_master_that_lost_its_scripts_still_stores(request: pytest.FixtureRequest, kind: str) -> None:
    """A promoted replica or a restarted node may not have the scripts: loaded again on use."""
    client = await clean_client(request, kind)
    store = RedisStore(client)
    await store.put(Put("s", "k1", b"one", 60_000, 10, "t", "m"))
    await client.script_flush()
    await store.put(Put("s", "k2", b"two", 60_000, 10, "t", "m", token="tok"))
    assert (await store.lookup("s", "k2", None, 0)).entry == b"two"
    await client.aclose()
