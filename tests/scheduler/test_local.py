"""The in-process queue, live: its timer and gauges as grants come and go."""

from __future__ import annotations

import asyncio

from extproc.metrics import Metrics
from extproc.scheduler.local import LocalScheduler
from extproc.scheduler.queue import CLASSES, Granted, Policy, Ticket
from extproc.scheduler.settings import Capacity

from .test_service import eventually


def in_flight(metrics: Metrics) -> float:
    return metrics.queue_in_flight.labels("primary")._value.get()


async def test_every_lease_expires_on_time_though_most_grants_leave_the_timer_asleep() -> None:
    # A grant wakes the timer only when its lease would expire before the timer's next wake-up:
    # the second grant comes while the timer sleeps until the first one's expiry.
    metrics = Metrics()
    policy = Policy(batch_window_s={c: 0.0 for c in CLASSES}, lease_s=0.6)
    # No capacity refresh in the test's time (each refresh polls the queue too): the timer alone.
    scheduler = LocalScheduler("primary", policy, Capacity(static_limit=4, refresh_ms=60_000), metrics)
    await scheduler.start()
    try:
        await asyncio.sleep(0.05)  # the timer asleep with nothing to wait for
        assert isinstance(await scheduler.acquire(Ticket("a")), Granted)
        await asyncio.sleep(0.3)
        assert isinstance(await scheduler.acquire(Ticket("b")), Granted)
        assert in_flight(metrics) == 2
        await eventually(lambda: "a" not in scheduler.queue.held, within=2.0)
        assert "b" in scheduler.queue.held  # it has 0.3 s to go
        await eventually(lambda: not scheduler.queue.held, within=2.0)
        assert metrics.queue_lease_expiries.labels("primary")._value.get() == 2
        assert in_flight(metrics) == 0
    finally:
        await scheduler.stop()


async def test_a_release_shows_in_the_gauges_at_once() -> None:
    metrics = Metrics()
    scheduler = LocalScheduler("primary", Policy(), Capacity(static_limit=4), metrics)
    await scheduler.start()
    try:
        assert isinstance(await scheduler.acquire(Ticket("a")), Granted)
        assert in_flight(metrics) == 1
        assert scheduler.release("a")
        assert in_flight(metrics) == 0
    finally:
        await scheduler.stop()
