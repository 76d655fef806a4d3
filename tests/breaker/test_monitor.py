"""Breakers of two gate processes sharing a real redis-server, with an injected clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from extproc.breaker import shared
from extproc.breaker.monitor import Breakers, PoolHealth
from extproc.breaker.state import Phase
from extproc.breaker.webhook import Notifier
from extproc.config import Breaker, Store, Webhook
from extproc.metrics import Metrics
from extproc.redis_client import Client
from extproc.redis_conn import connect
from load.stack import RedisServer
from tests.topology import SHARED, clean_client

CONFIG = Breaker(
    window_s=10,
    slices=10,
    min_samples=10,
    probe_min_samples=2,
    open_p95_s=1.0,
    close_p95_s=0.5,
    hold_s=2,
    recovery_s=3,
    probe_share=0.0,
    probe_interval_s=1.0,
    key_prefix="test:brk:",
)
POOLS = ["primary", "fallback"]


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder(Notifier):
    def __init__(self) -> None:
        super().__init__(Webhook(url="http://127.0.0.1:9/none"), Metrics())
        self.sent: list[dict[str, Any]] = []

    def notify(self, payload: dict[str, Any]) -> None:
        self.sent.append(payload)


def gate(clock: Clock, client: Client | None) -> tuple[Breakers, Recorder]:
    notes = Recorder()
    return Breakers(CONFIG, POOLS, Metrics(), client, clock=clock, draw=lambda: 0.5, notifier=notes), notes


@pytest.fixture(params=SHARED)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """Breaker state shared through one node, then through a 6-node cluster."""
    c = await clean_client(request, request.param, op_timeout_ms=500)
    yield c
    await c.aclose()


def phase(b: Breakers) -> Phase:
    return b.pools["primary"].state.phase


def slow(b: Breakers, n: int, latency: float = 2.0) -> None:
    for _ in range(n):
        b.record("primary", b.version("primary"), latency, error=False)


async def test_two_processes_merge_their_samples_and_switch_together(client: Client) -> None:
    clock = Clock()
    a, notes_a = gate(clock, client)
    b, notes_b = gate(clock, client)
    clock.now += 5
    slow(a, 6)
    slow(b, 6)  # neither process alone reaches min_samples (10)
    await a.sync_once()
    assert phase(a) is Phase.CLOSED
    await b.sync_once()
    assert phase(b) is Phase.OPEN
    await a.sync_once()
    assert phase(a) is Phase.OPEN
    assert not a.choose("primary").primary and not b.choose("primary").primary
    assert notes_a.sent == []  # only the process that won the transition notifies
    [note] = notes_b.sent
    assert (note["pool"], note["old_state"], note["new_state"]) == ("primary", "closed", "open")
    assert note["samples"] == 12 and note["p95_s"] >= 2.0 and note["window_s"] == 10
    stored = await shared.read_state(client, CONFIG.key_prefix, "primary")
    assert stored is not None and stored.phase is Phase.OPEN and stored.version == 1


async def test_half_open_probes_and_recovery_are_shared(client: Client) -> None:
    clock = Clock()
    a, notes_a = gate(clock, client)
    b, notes = gate(clock, client)
    clock.now += 5
    slow(a, 12)
    await a.sync_once()
    await b.sync_once()
    clock.now += 2.5
    await b.sync_once()
    await a.sync_once()
    assert phase(a) is phase(b) is Phase.HALF_OPEN
    # The first request of each process in HALF_OPEN is a probe; the next is not.
    assert a.choose("primary").probe and not a.choose("primary").primary
    for gate_ in (a, b):
        choice = gate_.choose("primary")
        gate_.record("primary", choice.version, 0.1, error=False)
    clock.now += 1
    await a.sync_once()
    await b.sync_once()  # both probes are in: the recovery clock starts
    clock.now += 3
    await b.sync_once()
    await a.sync_once()
    assert phase(a) is phase(b) is Phase.CLOSED
    sent = [(n["old_state"], n["new_state"]) for n in notes.sent + notes_a.sent]
    assert sorted(sent) == [("closed", "open"), ("half_open", "closed"), ("open", "half_open")]


async def test_samples_routed_under_an_older_state_are_dropped(client: Client) -> None:
    clock = Clock()
    a, _ = gate(clock, client)
    old = a.version("primary")
    clock.now += 5
    slow(a, 12)
    await a.sync_once()
    clock.now += 2.5
    await a.sync_once()
    assert phase(a) is Phase.HALF_OPEN
    for _i in range(5):
        a.record("primary", old, 9.0, error=False)  # stragglers sent before the breaker opened
    clock.now += 0.5
    await a.sync_once()
    assert phase(a) is Phase.HALF_OPEN


async def test_subscribers_get_pool_health_every_tick(client: Client) -> None:
    clock = Clock()
    a, _ = gate(clock, client)
    seen: list[PoolHealth] = []
    a.subscribe(seen.append)
    clock.now += 5
    slow(a, 4, latency=0.3)
    await a.sync_once()
    health = {h.pool: h for h in seen}
    assert set(health) == {"primary", "fallback"}
    assert health["primary"].samples == 4 and health["primary"].throughput > 0
    assert health["primary"].p95_s is not None and 0.3 <= health["primary"].p95_s < 0.34


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


async def test_redis_down_each_process_decides_alone_then_they_converge(own_redis: RedisServer) -> None:
    clock = Clock()
    store = Store(redis_url=own_redis.url, op_timeout_ms=200)
    ca, cb = connect(store), connect(store)
    a, notes_a = gate(clock, ca)
    b, _ = gate(clock, cb)
    await a.sync_once()
    await b.sync_once()
    own_redis.kill()
    clock.now += 5
    slow(a, 12)
    await a.sync_once()
    await b.sync_once()
    assert phase(a) is Phase.OPEN  # on its own samples
    assert phase(b) is Phase.CLOSED  # saw nothing slow itself
    assert [n["new_state"] for n in notes_a.sent] == ["open"]
    assert not a.choose("primary").primary and b.choose("primary").primary
    own_redis.start()
    clock.now += 0.5
    await a.sync_once()  # publishes its newer state to the fresh Redis
    await b.sync_once()
    assert phase(b) is Phase.OPEN
    assert a.metrics.registry.get_sample_value(
        "gate_store_errors_total", {"op": "breaker_push", "error": "ConnectionError"}
    )
    for c in (ca, cb):
        assert c is not None
        await c.aclose()


async def test_without_redis_a_single_process_works_alone() -> None:
    clock = Clock()
    a, notes = gate(clock, None)
    clock.now += 5
    slow(a, 12)
    await a.sync_once()
    assert phase(a) is Phase.OPEN and len(notes.sent) == 1


@pytest.mark.parametrize("shared_store", [False, True])
async def test_a_hang_opens_the_breaker_while_it_lasts(client: Client, shared_store: bool) -> None:
    """Calls waiting past the open threshold count as slow before any of them finishes."""
    clock = Clock()
    b, notes = gate(clock, client if shared_store else None)
    clock.now += 5  # past hold_s
    for _ in range(5):  # fast calls that finished
        b.record("primary", b.version("primary"), 0.1, error=False)
    waits = {f"hung-{i}": 0.5 for i in range(8)}  # in flight, waiting for a first byte
    for call, _ in waits.items():
        b.begin("primary", call, b.version("primary"), lambda call=call: waits.get(call))
    await b.sync_once()
    assert phase(b) is Phase.CLOSED  # younger than open_p95_s: not yet a sample
    waits.update({k: 3.0 for k in waits})  # the hang goes on
    await b.sync_once()
    assert phase(b) is Phase.OPEN and "p95" in notes.sent[-1]["reason"]
    assert b.metrics.breaker_oldest_wait.labels("primary")._value.get() == 3.0
    pool = b.pools["primary"]
    before = pool.window.stats(clock.now, pool.state.since).samples
    for call in waits:  # the hung calls end long after; made under the old state, they are not samples
        b.end("primary", call)
        b.record("primary", 0, 30.0, error=False)
    assert pool.window.stats(clock.now, pool.state.since).samples == before
    assert not pool.in_flight
