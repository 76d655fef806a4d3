"""Wait estimates and the top tier's reserve: tables for the pure functions, then the queue."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extproc.scheduler.estimate import releases_needed, reserve_slots, service_time, wait_estimate
from extproc.scheduler.queue import CLASSES, Event, Granted, Policy, Queue, Refused, Ticket

NO_WINDOWS = Policy(batch_window_s={c: 0.0 for c in CLASSES})

SERVICE_CASES = [
    ("nothing measured", [], [], None),
    ("running only: unknown", [], [5.0, 5.0], None),
    ("steady", [0.3, 0.3, 0.3], [], 0.3),
    ("fewer than a turn", [0.2, 0.4], [], 0.3),
    ("the last turn only", [9.0] + [0.2, 0.4] * 2, [], 0.3),
    ("a slowdown shows once every slot served one", [0.25] * 28 + [3.25] * 4, [], 3.25),
    ("running shorter than usual", [1.0, 1.0], [0.1, 0.2, 0.3], 1.0),
    ("running longer: slowed down", [0.25, 0.25], [2.0, 3.0, 0.1], 2.0),
]


@pytest.mark.parametrize(
    ("case", "recent", "ages", "expected"), SERVICE_CASES, ids=[c[0] for c in SERVICE_CASES]
)
def test_service_time(case: str, recent: list[float], ages: list[float], expected: float | None) -> None:
    got = service_time(recent, ages, limit=4)
    assert got == (None if expected is None else pytest.approx(expected))


WAIT_CASES = [
    # (case, ahead, free, limit, service_s, higher arrivals/s, expected seconds)
    ("a free slot", 0, 1, 4, 1.0, 0.0, 0.0),
    ("free slots for all ahead", 2, 3, 4, 1.0, 0.0, 0.0),
    ("first in line, pool full", 0, 0, 4, 1.0, 0.0, 0.25),
    ("eight ahead of four slots at 1 s", 8, 0, 4, 1.0, 0.0, 9 * 0.25),
    ("higher classes take half the releases", 8, 0, 4, 1.0, 2.0, 9 * 0.5),
    ("higher classes take everything: a tenth is left", 0, 0, 4, 1.0, 100.0, 2.5),
    ("nothing measured", 3, 0, 4, None, 0.0, None),
    ("pool closed", 3, 0, 0, 1.0, 0.0, None),
]


@pytest.mark.parametrize(
    ("case", "ahead", "free", "limit", "service", "higher", "expected"),
    WAIT_CASES,
    ids=[c[0] for c in WAIT_CASES],
)
def test_wait_estimate(
    case: str, ahead: int, free: int, limit: int, service: float | None, higher: float, expected: float | None
) -> None:
    got = wait_estimate(ahead, free, limit, service, higher)
    assert got == (None if expected is None else pytest.approx(expected))
    assert releases_needed(ahead, free) == max(0, ahead + 1 - free)


RESERVE_CASES = [
    # (case, limit, vip/s, service_s, factor, max_share, expected slots)
    ("no vip traffic", 16, 0.0, 1.0, 1.5, 0.5, 0),
    ("nothing measured", 16, 4.0, None, 1.5, 0.5, 0),
    ("turned off", 16, 4.0, 1.0, 0.0, 0.5, 0),
    ("concurrency 1.2 with headroom 1.5", 16, 4.8, 0.25, 1.5, 0.5, 2),
    ("capped at the share", 16, 40.0, 1.0, 1.5, 0.25, 4),
    ("never the last slot", 2, 40.0, 1.0, 1.5, 1.0, 1),
    ("one slot: nothing to reserve", 1, 40.0, 1.0, 1.5, 1.0, 0),
]


@pytest.mark.parametrize(
    ("case", "limit", "rate", "service", "factor", "share", "expected"),
    RESERVE_CASES,
    ids=[c[0] for c in RESERVE_CASES],
)
def test_reserve_slots(
    case: str, limit: int, rate: float, service: float | None, factor: float, share: float, expected: int
) -> None:
    assert reserve_slots(limit, rate, service, factor, share) == expected


def granted(events: list[Event]) -> list[str]:
    return [e.id for e in events if isinstance(e, Granted)]


def refused(events: list[Event]) -> dict[str, str]:
    return {e.id: e.reason for e in events if isinstance(e, Refused)}


def warm(q: Queue, cls_of: str, n: int, service_s: float, start: float = 0.0) -> float:
    """`n` requests of alternating classes, each held `service_s`, one at a time; returns the clock."""
    now = start
    for i in range(n):
        cls = "vip" if cls_of == "alternate" and i % 2 else "standard"
        id = f"warm{start}-{i}"
        assert granted(q.offer(Ticket(id, cls), now)) == [id]
        now += service_s
        assert q.release(id, now)
    return now


def test_a_full_pool_keeps_a_slot_for_vip_while_vip_traffic_flows() -> None:
    q = Queue(NO_WINDOWS, limit=4)
    now = warm(q, "alternate", 20, 0.25)  # 2 vip arrivals a second, 0.25 s each: concurrency 0.5
    assert q.reserved(now) == 1
    out: list[Event] = []
    for i in range(5):
        out += q.offer(Ticket(f"s{i}", deadline_s=60), now)
    assert granted(out) == ["s0", "s1", "s2"]  # the fourth slot waits for vip
    assert granted(q.offer(Ticket("v", "vip"), now)) == ["v"]  # at once, no release needed
    assert q.release("s0", now + 0.1)
    assert granted(q.poll(now + 0.1)) == ["s3"]


def test_without_vip_traffic_every_slot_is_open_to_every_tier() -> None:
    q = Queue(NO_WINDOWS, limit=4)
    now = warm(q, "standard", 20, 0.25)
    assert q.reserved(now) == 0
    out: list[Event] = []
    for i in range(4):
        out += q.offer(Ticket(f"s{i}"), now)
    assert granted(out) == ["s0", "s1", "s2", "s3"]


def test_reserve_off_by_policy() -> None:
    q = Queue(replace(NO_WINDOWS, reserve_factor=0.0), limit=4)
    now = warm(q, "alternate", 20, 0.25)
    assert q.reserved(now) == 0


def test_a_newcomer_is_shed_at_once_from_the_queue_ahead_and_service_times() -> None:
    q = Queue(replace(NO_WINDOWS, reserve_factor=0.0), limit=2)
    now = warm(q, "standard", 4, 1.0)  # 1 s per request, 2 slots: one release every 0.5 s
    for i in range(2):
        q.offer(Ticket(f"run{i}", deadline_s=60), now)
    for i in range(6):
        assert not refused(q.offer(Ticket(f"w{i}", deadline_s=60), now))
    # Both slots were just taken: releases at 1, 1, 2, 2, 3, 3, 4 s from now.
    out = q.offer(Ticket("late", deadline_s=3.5), now)  # the 7th
    (shed,) = [e for e in out if isinstance(e, Refused)]
    assert shed.reason == "deadline" and shed.eta_s == pytest.approx(4.0)
    assert not refused(q.offer(Ticket("vip", "vip", deadline_s=3.5), now))  # first in line: 1 s


def test_a_waiting_request_is_shed_as_soon_as_the_pool_slows_not_at_its_deadline() -> None:
    q = Queue(replace(NO_WINDOWS, reserve_factor=0.0), limit=2)
    now = warm(q, "standard", 4, 0.2)
    for i in range(2):
        q.offer(Ticket(f"run{i}", deadline_s=60), now)
    for i in range(6):
        assert not refused(q.offer(Ticket(f"w{i}", deadline_s=5.0), now))
    # Nothing is released: the running requests age, and with them the service estimate.
    shed_at: dict[str, float] = {}
    t = now
    while t < now + 5.0 and len(shed_at) < 6:
        t += 0.05
        for id in refused(q.poll(t)):
            shed_at[id] = t - now
    assert set(shed_at) == {f"w{i}" for i in range(6)}
    assert max(shed_at.values()) < 4.0  # well before the 5 s deadline
    assert shed_at["w5"] <= shed_at["w0"]  # the last in line is told first


def test_a_burst_on_a_slow_pool_is_shed_within_a_second_and_the_rest_is_served_in_time() -> None:
    """80 vip + 20 standard at once on 4 slots of 3.3 s: whoever cannot be served in time is
    told within a second (not when the first whole service time has passed), and whoever is
    kept gets a slot before its deadline."""
    q = Queue(limit=4)
    now = warm(q, "standard", 4, 3.3)
    tickets = [Ticket(f"v{i}", "vip", deadline_s=10.0) for i in range(80)]
    tickets += [Ticket(f"s{i}", deadline_s=5.0) for i in range(20)]
    events = [e for t in tickets for e in q.offer(t, now)]
    running = {id: now for id in granted(events)}
    shed_at = {id: 0.0 for id in refused(events)}
    served_at: dict[str, float] = dict.fromkeys(running, 0.0)
    t = now
    while t < now + 12.0:
        t += 0.05
        for id, started in list(running.items()):
            if t - started >= 3.3:
                q.release(id, t)
                del running[id]
        for e in q.poll(t):
            if isinstance(e, Granted):
                running[e.id], served_at[e.id] = t, t - now
            elif isinstance(e, Refused):
                shed_at[e.id] = t - now
    assert len(shed_at) + len(served_at) == 100
    assert max(shed_at.values()) <= 1.0
    deadlines = {t.id: t.deadline_s for t in tickets}
    assert all(at <= deadlines[id] for id, at in served_at.items())
    # The first in line after the four running: its slot comes at 3.3 s, well in time. An
    # estimate that does not shrink while it waits would shed it once its budget fell below.
    assert "v4" in served_at


def test_a_request_whose_answer_would_reach_its_client_too_late_is_refused() -> None:
    """4 slots of 3.3 s, all just taken: the next slot comes in 3.3 s, and the answer 3.3 s
    later, past a client that gives up after 5 s; one that waits 10 s is queued."""
    q = Queue(NO_WINDOWS, limit=4)
    now = warm(q, "vip", 4, 3.3)
    for i in range(4):
        assert granted(q.offer(Ticket(f"run{i}", "vip", answer_by_s=5.0), now)) == [f"run{i}"]
    (shed,) = refused(q.offer(Ticket("impatient", "vip", deadline_s=10.0, answer_by_s=5.0), now))
    assert shed == "impatient"
    assert not refused(q.offer(Ticket("patient", "vip", deadline_s=10.0, answer_by_s=10.0), now))
    assert not refused(q.offer(Ticket("unknown", "vip", deadline_s=10.0), now))


def test_a_probe_slot_goes_only_to_a_request_whose_client_waits_two_service_times() -> None:
    """6 slots, of which the pool has been seen to run 4 without queueing: slots 5 and 6 are
    probes, where the model server may queue a request for a whole service time (3.3 s) before
    running it. A client that gives up after 5 s must not be put there: it is refused at once
    (the next proven slot comes in 3.3 s); one that waits 10 s takes the probe slot."""
    q = Queue(NO_WINDOWS, limit=4)
    now = warm(q, "vip", 4, 3.3)
    for i in range(4):
        assert granted(q.offer(Ticket(f"run{i}", "vip", answer_by_s=5.0), now)) == [f"run{i}"]
    q.set_capacity(6, pressure=False, probing=2)
    assert refused(q.offer(Ticket("impatient", "vip", deadline_s=10.0, answer_by_s=5.0), now)) == {
        "impatient": "deadline"
    }
    assert granted(q.offer(Ticket("patient", "vip", deadline_s=10.0, answer_by_s=10.0), now)) == ["patient"]
    assert granted(q.offer(Ticket("unknown", "vip", deadline_s=10.0), now)) == ["unknown"]


def test_a_request_that_cannot_afford_a_probe_lets_the_next_take_it_and_the_queue_sleeps() -> None:
    """A waiting request that may not take the open probe slot neither blocks a patient one
    behind it nor makes the queue poll in a loop: the next wake-up is a real time ahead."""
    q = Queue(Policy(batch_window_s={c: 0.0 for c in CLASSES}, recheck_s=0.05), limit=4)
    now = warm(q, "vip", 4, 1.0)
    for i in range(4):
        q.offer(Ticket(f"run{i}", "vip"), now)
    q.set_capacity(5, pressure=False, probing=1)
    t = now + 0.5  # the running requests are half done: the next proven slot comes in 0.5 s
    # 1.8 s left to its client: too short for a probe (2 × 1 s), long enough for a proven slot.
    assert granted(q.offer(Ticket("hurried", "vip", deadline_s=10.0, answer_by_s=1.8), t)) == []
    assert "hurried" in q.waiting
    assert q.poll(t + 0.06) == []
    wake = q.next_wakeup(t + 0.06)
    assert wake is not None and wake >= t + 0.06 + 0.05  # the next ETA check, not at once
    assert granted(q.offer(Ticket("patient", "standard", deadline_s=10.0), t + 0.06)) == ["patient"]
    q.release("run0", now + 1.0)
    q.release("run1", now + 1.0)  # 3 held, "patient" among them: a proven slot is open
    assert granted(q.poll(now + 1.0)) == ["hurried"]


def test_vip_goes_over_the_limit_of_a_preempting_pool_but_never_into_a_closed_one() -> None:
    q = Queue(Policy(batch_window_s={c: 0.0 for c in CLASSES}, preempt_slots=1), limit=2)
    for id in ("a", "b"):
        assert granted(q.offer(Ticket(id, "standard"), 0.0)) == [id]
    assert granted(q.offer(Ticket("premium", "premium"), 0.0)) == []  # only the top class preempts
    assert granted(q.offer(Ticket("vip", "vip"), 0.0)) == ["vip"]
    assert granted(q.offer(Ticket("vip2", "vip"), 0.0)) == []  # one slot over the limit, taken
    q.set_capacity(0, pressure=False)  # the breaker closed the pool
    q.release("vip", 0.1)
    assert granted(q.poll(0.1)) == []
