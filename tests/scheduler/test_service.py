"""The scheduler over real gRPC: the service, and the gate's client with its fail-open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import pytest

from extproc.metrics import Metrics
from extproc.scheduler.client import RemoteScheduler
from extproc.scheduler.local import LocalScheduler
from extproc.scheduler.proto import acquire_request, pb, pb_grpc, ticket_of
from extproc.scheduler.queue import CLASSES, Granted, Policy, Refused, Ticket
from extproc.scheduler.service import SchedulerService
from extproc.scheduler.settings import Capacity
from load.stack import free_port

FAST = Policy(batch_window_s={c: 0.0 for c in CLASSES})


@asynccontextmanager
async def service(port: int, policy: Policy = FAST, slots: int = 1) -> AsyncIterator[LocalScheduler]:
    scheduler = LocalScheduler("primary", policy, Capacity(static_limit=slots), Metrics())
    await scheduler.start()
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(SchedulerService(scheduler), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield scheduler
    finally:
        await server.stop(0)
        await scheduler.stop()


@asynccontextmanager
async def client(port: int, lease_s: float = 60.0) -> AsyncIterator[RemoteScheduler]:
    remote = RemoteScheduler("primary", f"127.0.0.1:{port}", Metrics(), timeout_s=0.5, lease_s=lease_s)
    try:
        yield remote
    finally:
        await remote.close()


async def eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    for _ in range(int(within / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_grant_then_release_exactly_once(port: int) -> None:
    async with service(port) as scheduler, client(port) as remote:
        outcome = await remote.acquire(Ticket("a", "vip"), 10, "acme")
        assert isinstance(outcome, Granted) and outcome.cls == "vip"
        status = await remote.stub.Status(pb.StatusRequest())
        assert (status.pool, status.limit, status.in_flight, status.capacity_source) == (
            "primary",
            1,
            1,
            "static",
        )
        await remote.release("a")
        assert scheduler.status().in_flight == 0
        assert not scheduler.release("a")


async def test_vip_waiting_behind_a_full_pool_goes_before_an_earlier_standard(port: int) -> None:
    async with service(port) as scheduler, client(port) as remote:
        assert isinstance(await remote.acquire(Ticket("busy"), 10, "t"), Granted)
        standard = asyncio.create_task(remote.acquire(Ticket("std", "standard"), 10, "t"))
        await eventually(lambda: scheduler.status().queued["standard"] == 1)
        vip = asyncio.create_task(remote.acquire(Ticket("vip", "vip"), 10, "t"))
        await eventually(lambda: scheduler.status().queued["vip"] == 1)
        await remote.release("busy")
        assert isinstance(await vip, Granted)
        assert not standard.done()
        await remote.release("vip")
        assert isinstance(await standard, Granted)


async def test_a_cancelled_acquire_leaves_the_queue_at_once(port: int) -> None:
    async with service(port) as scheduler, client(port) as remote:
        await remote.acquire(Ticket("busy"), 10, "t")
        waiting = asyncio.create_task(remote.acquire(Ticket("gone"), 10, "t"))
        await eventually(lambda: sum(scheduler.status().queued.values()) == 1)
        waiting.cancel()
        await eventually(lambda: sum(scheduler.status().queued.values()) == 0, within=1.0)
        await remote.release("busy")
        assert scheduler.status().in_flight == 0


async def test_a_full_queue_refuses_with_a_reason_and_an_eta(port: int) -> None:
    policy = Policy(batch_window_s={c: 0.0 for c in CLASSES}, max_queued=1)
    async with service(port, policy) as scheduler, client(port) as remote:
        await remote.acquire(Ticket("busy"), 10, "t")
        queued = asyncio.create_task(remote.acquire(Ticket("q1"), 10, "t"))
        await eventually(lambda: sum(scheduler.status().queued.values()) == 1)
        outcome = await remote.acquire(Ticket("q2"), 10, "t")
        assert isinstance(outcome, Refused) and outcome.reason == "queue_full"
        queued.cancel()


async def test_unreachable_scheduler_fails_open_and_queueing_resumes_when_it_is_back(port: int) -> None:
    async with client(port) as remote:
        started = asyncio.get_running_loop().time()
        assert await remote.acquire(Ticket("a"), 10, "t") is None
        assert asyncio.get_running_loop().time() - started < 2.0
        errors = remote.metrics.scheduler_errors.labels("primary", "acquire", "UNAVAILABLE")._value.get()
        assert errors == 1
        async with service(port) as scheduler:
            for i in range(100):
                outcome = await remote.acquire(Ticket(f"b{i}"), 10, "t")
                if outcome is not None:
                    break
                await asyncio.sleep(0.05)
            assert isinstance(outcome, Granted)
            assert scheduler.status().in_flight == 1


async def test_grants_of_a_dead_gate_expire_and_renewed_ones_do_not(port: int) -> None:
    policy = Policy(batch_window_s={c: 0.0 for c in CLASSES}, lease_s=0.4)
    async with service(port, policy, slots=4) as scheduler:
        async with client(port, lease_s=0.4) as living:
            assert isinstance(await living.acquire(Ticket("renewed"), 10, "t"), Granted)
            dead = RemoteScheduler("primary", f"127.0.0.1:{port}", Metrics(), 0.5, lease_s=60)
            assert isinstance(await dead.acquire(Ticket("orphan"), 10, "t"), Granted)
            await dead.close()  # the gate process died without releasing
            await asyncio.sleep(1.0)
            assert set(scheduler.queue.held) == {"renewed"}
        assert scheduler.queue.held.keys() == {"renewed"}


@pytest.fixture
def port() -> int:
    return free_port()


def test_the_tickets_every_field_crosses_the_wire() -> None:
    ticket = Ticket("id-1", "premium", urgent=True, tokens=321, deadline_s=2.5, answer_by_s=5.0)
    assert ticket_of(acquire_request("primary", ticket, 10, "acme")) == ticket
    bare = Ticket("id-2")
    assert ticket_of(acquire_request("primary", bare, 0, "acme")) == bare
