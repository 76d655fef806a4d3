"""The cache stage, hook by hook, on both stores: hits, replays, rules, coalescing, fail-open."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from extproc.cache.redis_store import RedisStore
from extproc.cache.store import MemoryStore, Put, Store
from extproc.exchange import Exchange
from extproc.redis_wire import FastRedis
from extproc.stages.cache import Cache
from load.stack import RedisServer

from .helpers import CHAT, Upstream, WordEmbedder, cache_stage, chat, config, matcher, send


def stage_on(store: Store, embedder: WordEmbedder | None = None, **cfg: object) -> Cache:
    return cache_stage(config(**cfg), store, matcher(embedder))


def count(stage: Cache, result: str) -> float:
    return stage.b.metrics.cache_requests.labels(result)._value.get()  # type: ignore[no-any-return]


async def test_repeat_is_a_hit_with_the_same_answer_and_a_fresh_id(store: Store) -> None:
    stage, up = stage_on(store), Upstream()
    first = await send(stage, chat("What is the capital of France?"), up)
    again = await send(stage, chat("  what is the CAPITAL of  france?"), up)
    assert (first.cache, first.upstream, again.cache, again.upstream) == ("miss", True, "hit", False)
    assert (again.headers["x-gate-cache-match"], again.headers["x-gate-similarity"]) == ("exact", "1.0000")
    near = await send(stage, chat("What is the capital of France ?"), up)  # canonical text: near-exact
    assert (near.cache, near.headers["x-gate-cache-match"]) == ("hit", "near")
    assert again.text() == first.text() == "Answer 1 to: What is the capital of France?"
    assert b"chatcmpl-up" not in again.body
    assert up.calls == 1 and not stage.b.leases.local and not len(stage.b.leases.wakeups)


async def test_paraphrase_hits_by_meaning_and_should_miss_misses(store: Store) -> None:
    emb = WordEmbedder()
    stage, up = stage_on(store, emb), Upstream()
    await send(stage, chat("What is the capital of France?"), up)
    para = await send(stage, chat("What is the capital city of France?"), up)
    assert (para.cache, para.headers["x-gate-cache-match"]) == ("hit", "semantic")
    assert 0.88 <= float(para.headers["x-gate-similarity"]) < 1
    assert para.text() == "Answer 1 to: What is the capital of France?"
    miss = await send(stage, chat("What is the capital of Spain?"), up)
    assert (miss.cache, miss.upstream) == ("miss", True)
    embedded = emb.calls
    repeat = await send(stage, chat("What is the capital city of France?"), up)  # the paraphrase's alias
    assert (repeat.cache, repeat.headers["x-gate-cache-match"]) == ("hit", "semantic")
    assert emb.calls == embedded  # answered by its exact key: no embedding
    assert up.calls == 2


@pytest.mark.parametrize("first_stream", [False, True])
async def test_streamed_and_plain_callers_get_each_others_answers(store: Store, first_stream: bool) -> None:
    stage, up = stage_on(store), Upstream()
    original = await send(stage, chat("Explain TCP", stream=first_stream), up)
    for stream in (False, True):
        hit = await send(stage, chat("Explain TCP", stream=stream), up)
        assert hit.cache == "hit"
        assert hit.headers["content-type"] == ("text/event-stream" if stream else "application/json")
        assert hit.text() == original.text()
        if stream:
            assert hit.body.endswith(b"data: [DONE]\n\n")
    assert up.calls == 1


async def test_cache_control_and_uncacheable_answers(store: Store) -> None:
    stage, up = stage_on(store), Upstream()
    nc = await send(stage, chat("q1"), up, {"cache-control": "no-cache"})
    assert nc.cache == "miss"
    assert (await send(stage, chat("q1"), up)).cache == "hit"  # no-cache stored its answer
    assert (await send(stage, chat("q1"), up, {"cache-control": "no-cache"})).upstream  # and never reads
    await send(stage, chat("q2"), up, {"cache-control": "no-store"})
    assert (await send(stage, chat("q2"), up)).cache == "miss"
    assert (await send(stage, chat("q3", n=2), up)).cache == "bypass"
    assert (await send(stage, chat("q3", temperature=1.5), up)).cache == "bypass"
    tools = Upstream(tool_call=True)
    await send(stage, chat("q4"), tools)
    assert (await send(stage, chat("q4"), tools)).upstream
    await send(stage, chat("q5"), Upstream(status=500))
    assert (await send(stage, chat("q5"), up)).cache == "miss"
    await send(stage, chat("q6", stream=True), up, cancel_upstream=True)  # the stream ended early
    assert (await send(stage, chat("q6"), up)).cache == "miss"


async def test_tenants_do_not_share_answers(store: Store) -> None:
    stage, up = stage_on(store), Upstream()
    await send(stage, chat("q"), up, tenant="acme")
    assert (await send(stage, chat("q"), up, tenant="globex")).cache == "miss"
    shared = stage_on(store, shared_across_tenants=True)
    await send(shared, chat("q"), up, tenant="acme")
    assert (await send(shared, chat("q"), up, tenant="globex")).cache == "hit"


async def test_identical_burst_reaches_the_model_once(store: Store) -> None:
    stage, up = stage_on(store), Upstream(delay=0.2)
    results = await asyncio.gather(*(send(stage, chat("burst", stream=i % 2 == 0), up) for i in range(20)))
    assert up.calls == 1
    assert sorted(r.cache or "" for r in results) == ["coalesced"] * 19 + ["miss"]
    assert {r.text() for r in results} == {"Answer 1 to: burst"}
    assert not stage.b.leases.local and not len(stage.b.leases.wakeups)


class SlowPuts:
    """A store whose answers go in only when the test lets them (a slow store's round trip)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.go = asyncio.Event()
        self.held = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def put(self, item: Put) -> None:
        self.held += 1
        await self.go.wait()
        await self.inner.put(item)


async def test_a_miss_is_answered_before_its_store_and_its_followers_still_get_it(store: Store) -> None:
    slow = SlowPuts(store)
    stage, up = stage_on(cast(Store, slow)), Upstream()
    headers = {"content-type": "application/json"}
    ex = Exchange("POST", CHAT, headers, payload=chat("slow store"), tenant="acme")
    assert await stage.on_request(ex) is None  # a miss: this request leads
    follower = asyncio.ensure_future(send(stage, chat("slow store"), up))
    await asyncio.sleep(0.05)
    status, head, chunks = await up(chat("slow store"))
    await stage.on_response(ex, status, head)
    for chunk in chunks:
        await stage.on_response_body(ex, chunk, False)
    # The answer's last message returns while the store still holds its entry, and the
    # exchange's end does not hand the lead to the follower (which would call the model again).
    await asyncio.wait_for(stage.on_response_body(ex, b"", True), 0.5)
    await stage.on_done(ex)
    await asyncio.sleep(0.05)
    assert (slow.held, follower.done(), up.calls) == (1, False, 1)
    slow.go.set()
    got = await asyncio.wait_for(follower, 5)
    assert (got.cache, got.upstream, up.calls) == ("coalesced", False, 1)
    assert got.text() == "Answer 1 to: slow store"
    assert (await send(stage, chat("slow store"), up)).cache == "hit"
    assert not stage.b.leases.local and not len(stage.b.leases.wakeups)


async def test_a_paraphrase_joins_the_request_in_flight_instead_of_calling_the_model(store: Store) -> None:
    stage, up = stage_on(store), Upstream(delay=0.3)
    leader = asyncio.ensure_future(send(stage, chat("What is the capital of France?"), up))
    await asyncio.sleep(0.1)  # the leader is waiting for the model
    para, other = await asyncio.gather(
        send(stage, chat("What is the capital city of France?"), up),
        send(stage, chat("What is the capital of Spain?"), up),  # a different question: no join
    )
    first = await leader
    assert (para.cache, para.upstream, para.headers["x-gate-cache-match"]) == ("coalesced", False, "semantic")
    assert para.text() == first.text() and first.text().endswith("to: What is the capital of France?")
    assert (other.cache, other.upstream) == ("miss", True)
    assert up.calls == 2
    repeat = await send(stage, chat("What is the capital city of France?"), up)  # kept under its own key
    assert (repeat.cache, repeat.text(), up.calls) == ("hit", first.text(), 2)
    assert not stage.b.leases.local and not len(stage.b.leases.wakeups)


async def test_joining_flights_can_be_turned_off(store: Store) -> None:
    cfg = config()
    cfg = cfg.model_copy(update={"semantic": cfg.semantic.model_copy(update={"join_in_flight": False})})
    stage, up = cache_stage(cfg, store, matcher()), Upstream(delay=0.3)
    leader = asyncio.ensure_future(send(stage, chat("What is the capital of France?"), up))
    await asyncio.sleep(0.1)
    para = await send(stage, chat("What is the capital city of France?"), up)
    await leader
    assert (para.cache, para.upstream, up.calls) == ("miss", True, 2)


async def test_a_paraphrase_whose_flight_fails_asks_the_model_itself(store: Store) -> None:
    stage, up = stage_on(store), Upstream(delay=0.3, fail=1)
    leader = asyncio.ensure_future(send(stage, chat("What is the capital of France?"), up))
    await asyncio.sleep(0.1)
    para = await send(stage, chat("What is the capital city of France?"), up)
    assert (await leader).status == 500
    assert (para.cache, para.upstream, para.status) == ("miss", True, 200)
    # Its own question, not the failed leader's.
    assert para.text() == "Answer 2 to: What is the capital city of France?"
    assert up.calls == 2


async def test_a_paraphrase_in_another_process_joins_the_flight(redis_server: RedisServer) -> None:
    if redis_server.proc is None:
        redis_server.start()
    clients = [FastRedis.from_url(redis_server.url) for _ in range(2)]
    await clients[0].flushall()
    here, there = (cache_stage(config(), RedisStore(c), matcher(), client=c) for c in clients)
    up = Upstream(delay=0.4)
    leader = asyncio.ensure_future(send(here, chat("What is the capital of France?"), up))
    await asyncio.sleep(0.2)  # announced by now (beside the request, in the background)
    para = await send(there, chat("What is the capital city of France?"), up)
    assert (para.cache, para.upstream, up.calls) == ("coalesced", False, 1)
    assert para.text() == (await leader).text()
    for c in clients:
        await c.aclose()


@pytest.mark.parametrize("how", ["error", "cancelled"])
async def test_failed_leader_hands_over_to_exactly_one_follower(store: Store, how: str) -> None:
    stage = stage_on(store)
    up = Upstream(delay=0.15, fail=1 if how == "error" else 0)
    leader = asyncio.ensure_future(send(stage, chat("q"), up, cancel_upstream=how == "cancelled"))
    await asyncio.sleep(0.05)
    followers = await asyncio.gather(*(send(stage, chat("q"), up) for _ in range(8)))
    await leader
    assert up.calls == 2  # the failed leader, then one new leader for all the others
    assert sorted(r.cache or "" for r in followers) == ["coalesced"] * 7 + ["miss"]
    assert {r.text() for r in followers} == {"Answer 2 to: q"}


async def test_follower_waits_no_longer_than_its_bound(store: Store) -> None:
    stage = stage_on(store, max_wait_s=0.3, lease_s=5.0)
    slow = Upstream(delay=1.5)
    leader = asyncio.ensure_future(send(stage, chat("q"), slow))
    await asyncio.sleep(0.05)
    started = asyncio.get_running_loop().time()
    follower = await send(stage, chat("q"), Upstream())
    assert follower.upstream and follower.cache == "miss"
    assert asyncio.get_running_loop().time() - started < 1.2
    await leader


async def test_leader_lease_outlives_its_ttl_while_the_answer_is_running(store: Store) -> None:
    stage = stage_on(store, lease_s=0.3, max_wait_s=3.0)
    up = Upstream(delay=0.8)
    results = await asyncio.gather(
        send(stage, chat("long"), up), *(send(stage, chat("long"), up) for _ in range(3))
    )
    assert up.calls == 1
    assert sorted(r.cache or "" for r in results) == ["coalesced"] * 3 + ["miss"]


async def test_embedder_failure_keeps_the_exact_path(store: Store) -> None:
    emb = WordEmbedder()
    stage, up = stage_on(store, emb), Upstream()
    emb.fail = True
    await send(stage, chat("What is the capital of France?"), up)
    assert (await send(stage, chat("What is the capital of France?"), up)).cache == "hit"
    assert (await send(stage, chat("What is the capital city of France?"), up)).cache == "miss"
    skips = stage.b.metrics.cache_semantic_skips.labels("embed_error")._value.get()
    assert skips == 2  # the hit never embedded


async def test_unreadable_text_is_never_embedded(store: Store) -> None:
    emb = WordEmbedder()
    stage, up = stage_on(store, emb), Upstream()
    await send(stage, chat("怎么开通花呗"), up)
    assert (await send(stage, chat("怎么关闭花呗"), up)).cache == "miss"
    assert emb.calls == 0


async def test_dead_redis_skips_the_cache_and_every_request_is_answered(redis_server: RedisServer) -> None:
    client = FastRedis.from_url(redis_server.url, socket_timeout=0.2, socket_connect_timeout=0.2)
    stage = cache_stage(config(), RedisStore(client), matcher(), client=client, op_timeout_s=0.2)
    up = Upstream()
    await send(stage, chat("q"), up)
    redis_server.kill()
    try:
        results = await asyncio.gather(*(send(stage, chat(f"q{i % 3}"), up) for i in range(10)))
        assert [r.status for r in results] == [200] * 10
        assert {r.cache for r in results} == {"bypass"}
        assert count(stage, "skipped") == 10
        assert stage.b.metrics.store_errors.labels("cache_lookup", "ConnectionError")._value.get() > 0
    finally:
        redis_server.start()
        await client.aclose()


async def test_semantic_profiles_choose_the_matcher_per_tenant_and_route(store: Store) -> None:
    from extproc.config import SemanticProfile

    emb = WordEmbedder()
    profiles = [(SemanticProfile(tenant="cn"), matcher(emb)), (SemanticProfile(path_prefix="/v1/"), None)]
    default = matcher(WordEmbedder())
    stage = cache_stage(config(), store, default, profiles=profiles)
    up = Upstream()
    for tenant in ("cn", "acme"):
        await send(stage, chat("What is the capital of France?"), up, tenant=tenant)
        para = await send(stage, chat("What is the capital city of France?"), up, tenant=tenant)
        assert para.cache == ("hit" if tenant == "cn" else "miss"), tenant
    assert emb.calls > 0  # the tenant's own embedder did the work
    assert up.calls == 3  # two first asks, and acme's paraphrase (its profile turns the layer off)


async def test_a_centre_moves_the_buckets_never_the_similarity(store: Store) -> None:
    from extproc.cache.lsh import Lsh

    emb = WordEmbedder()
    center = 0.3 * await emb.embed("What is the weather like")
    centred = matcher(emb)
    centred.lsh = Lsh.create(64, 4, 12, seed=1, center=center, name="words")
    up = Upstream()
    plain_stage = stage_on(MemoryStore())
    await send(plain_stage, chat("What is the capital of France?"), up)
    plain = await send(plain_stage, chat("What is the capital city of France?"), up)
    # Entries stored before the centre was set: still exact hits, no longer semantic candidates.
    before = stage_on(store)
    await send(before, chat("What is the capital of France?"), up)
    after = cache_stage(config(), store, centred)
    assert (await send(after, chat("what is the capital of  France?"), up)).cache == "hit"
    assert (await send(after, chat("What is the capital city of France?"), up)).cache == "miss"
    # Under the centre, the same pair hits at the same cosine, taken on the raw vectors.
    await send(after, chat("Which city is the capital of Italy?"), up)
    para = await send(after, chat("Which city is the capital city of Italy?"), up)
    fresh = stage_on(MemoryStore())
    await send(fresh, chat("Which city is the capital of Italy?"), up)
    unc = await send(fresh, chat("Which city is the capital city of Italy?"), up)
    assert (para.cache, unc.cache, plain.cache) == ("hit", "hit", "hit")
    assert para.headers["x-gate-similarity"] == unc.headers["x-gate-similarity"]
