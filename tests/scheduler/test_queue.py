"""The admission queue core: tables of cases, then Hypothesis properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.scheduler.queue import (
    CLASSES,
    WORST_BAND,
    Demoted,
    Event,
    Expired,
    Granted,
    Policy,
    Queue,
    Refused,
    Ticket,
    band_of,
)

NO_WINDOWS = Policy(batch_window_s={c: 0.0 for c in CLASSES})


def granted(events: list[Event]) -> list[str]:
    return [e.id for e in events if isinstance(e, Granted)]


def refused(events: list[Event]) -> dict[str, str]:
    return {e.id: e.reason for e in events if isinstance(e, Refused)}


# -- tables ---------------------------------------------------------------------------------

ORDER_CASES = [
    ("tier first", [("s", "standard", False), ("p", "premium", False), ("v", "vip", False)], ["v", "p", "s"]),
    ("urgent within its tier", [("a", "premium", False), ("b", "premium", True)], ["b", "a"]),
    ("urgent does not jump a tier", [("p", "premium", True), ("v", "vip", False)], ["v", "p"]),
    ("arrival within a band", [("a", "standard", False), ("b", "standard", False)], ["a", "b"]),
]


@pytest.mark.parametrize(("case", "arrivals", "order"), ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_grant_order(case: str, arrivals: list[tuple[str, str, bool]], order: list[str]) -> None:
    q = Queue(NO_WINDOWS, limit=0)
    for i, (id, cls, urgent) in enumerate(arrivals):
        q.offer(Ticket(id, cls, urgent), now=i * 0.001)
    q.set_capacity(len(arrivals), pressure=False)
    assert granted(q.poll(0.01)) == order


@pytest.mark.parametrize(("cls", "window"), [("vip", 0.002), ("premium", 0.010), ("standard", 0.050)])
def test_batch_window_holds_a_class_while_the_pool_is_full(cls: str, window: float) -> None:
    q = Queue(limit=1)
    assert granted(q.offer(Ticket("x", cls), now=0.0)) == ["x"]  # a free slot: at once
    assert granted(q.offer(Ticket("a", cls), now=0.0)) == []
    assert granted(q.offer(Ticket("b", cls), now=window / 2)) == []
    q.set_capacity(3, pressure=False)
    assert granted(q.poll(window / 2)) == []
    assert q.next_wakeup(window / 2) == pytest.approx(window)
    assert granted(q.poll(window)) == ["a", "b"]


def test_an_idle_pool_grants_at_once_in_every_class() -> None:
    q = Queue(limit=3)
    assert granted(q.offer(Ticket("s", "standard"), now=0.0)) == ["s"]
    assert granted(q.offer(Ticket("p", "premium"), now=0.0)) == ["p"]
    assert granted(q.offer(Ticket("v", "vip"), now=0.0)) == ["v"]


def test_under_memory_pressure_only_requests_that_waited_are_released() -> None:
    q = Queue(NO_WINDOWS, limit=10)
    q.set_capacity(10, pressure=True)
    assert granted(q.offer(Ticket("a"), now=0.0)) == []
    assert granted(q.poll(0.1)) == []
    assert granted(q.poll(0.2)) == ["a"]


def test_high_class_is_demoted_after_max_wait_and_goes_behind_fresh_vips() -> None:
    q = Queue(NO_WINDOWS, limit=0)
    q.offer(Ticket("old-vip", "vip"), now=0.0)
    events = q.poll(0.31)
    assert Demoted("old-vip", "vip") in events
    q.offer(Ticket("new-vip", "vip"), now=0.32)
    q.offer(Ticket("new-standard", "standard"), now=0.33)
    q.set_capacity(3, pressure=False)
    out = [e for e in q.poll(0.34) if isinstance(e, Granted)]
    assert [e.id for e in out] == ["new-vip", "old-vip", "new-standard"]
    assert out[1].cls == "standard" and out[1].asked == "vip" and out[1].demoted


def test_aging_lets_an_old_standard_request_pass_new_vips() -> None:
    q = Queue(replace(NO_WINDOWS, aging_step_s=1.0), limit=0)
    q.offer(Ticket("old", "standard"), now=0.0)
    q.offer(Ticket("vip", "vip"), now=5.0)
    q.set_capacity(1, pressure=False)
    assert granted(q.poll(5.0)) == ["old"]


def test_full_queue_refuses_an_equal_newcomer_and_evicts_for_a_better_one() -> None:
    q = Queue(replace(NO_WINDOWS, max_queued=2), limit=0)
    q.offer(Ticket("s1"), now=0.0)
    q.offer(Ticket("s2"), now=0.0)
    assert refused(q.offer(Ticket("s3"), now=0.0)) == {"s3": "queue_full"}
    assert refused(q.offer(Ticket("v", "vip"), now=0.0)) == {"s2": "evicted"}
    assert set(q.waiting) == {"s1", "v"}


def test_token_bound_counts_estimated_tokens() -> None:
    q = Queue(replace(NO_WINDOWS, max_queued_tokens=1000), limit=0)
    q.offer(Ticket("a", tokens=600), now=0.0)
    assert refused(q.offer(Ticket("b", tokens=600), now=0.0)) == {"b": "queue_full"}
    assert refused(q.offer(Ticket("huge", "vip", tokens=2000), now=0.0)) == {"huge": "queue_full"}
    assert q.queued_tokens == 600


def test_eta_from_the_drain_rate_sheds_what_cannot_make_its_deadline() -> None:
    q = Queue(NO_WINDOWS, limit=1)
    for i in range(10):  # one release every 100 ms: 10 per second
        q.offer(Ticket(f"warm{i}"), now=i * 0.1)
        assert q.release(f"warm{i}", now=i * 0.1 + 0.1)
    q.set_capacity(0, pressure=False)
    for i in range(20):
        q.offer(Ticket(f"w{i}", deadline_s=60), now=1.0)
    out = q.offer(Ticket("late", deadline_s=1.0), now=1.0)
    (shed,) = [e for e in out if isinstance(e, Refused)]
    assert shed.reason == "deadline"
    assert 1.5 < shed.eta_s < 3.0  # 21 ahead at ~10/s
    assert q.offer(Ticket("vip", "vip", deadline_s=1.0), now=1.0) == []


def test_eta_of_a_lower_class_counts_what_higher_classes_will_take_first() -> None:
    q = Queue(NO_WINDOWS, limit=1)
    for i in range(20):  # 10 releases a second for 2 s, and 5 vip arrivals a second
        q.offer(Ticket(f"w{i}", "vip" if i % 2 else "standard"), now=i * 0.1)
        assert q.release(f"w{i}", now=i * 0.1 + 0.1)
    q.set_capacity(0, pressure=False)
    for i in range(9):
        q.offer(Ticket(f"s{i}", deadline_s=60), now=2.0)
    assert q.eta_for("vip", now=2.0) == pytest.approx(1 / 10, rel=0.1)  # first in line at 10/s
    assert q.eta_for("standard", now=2.0) == pytest.approx(10 / 5, rel=0.15)  # 10 ahead at 10/s minus 5/s


def test_waiting_past_the_deadline_is_refused() -> None:
    q = Queue(NO_WINDOWS, limit=0)
    q.offer(Ticket("a", deadline_s=0.5), now=0.0)
    assert q.next_wakeup(0.0) == pytest.approx(0.5)
    assert refused(q.poll(0.5)) == {"a": "timed_out"}
    assert not q.waiting


def test_cancel_leaves_the_queue_and_a_lease_expires_once() -> None:
    q = Queue(replace(NO_WINDOWS, lease_s=10), limit=1)
    assert granted(q.offer(Ticket("held"), now=0.0)) == ["held"]
    q.offer(Ticket("waiting"), now=0.0)
    assert q.cancel("waiting", now=1.0) and not q.waiting
    assert q.renew(["held", "gone"], now=5.0) == ["gone"]
    assert q.poll(14.9) == []
    assert q.poll(15.0) == [Expired("held", "standard")]
    assert not q.release("held", now=16.0)


def test_duplicate_offer_is_ignored() -> None:
    q = Queue(NO_WINDOWS, limit=1)
    assert granted(q.offer(Ticket("a"), now=0.0)) == ["a"]
    assert q.offer(Ticket("a"), now=0.0) == []
    assert len(q.held) == 1


# -- properties -----------------------------------------------------------------------------

tickets = st.tuples(st.sampled_from(CLASSES), st.booleans(), st.integers(0, 400))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), tickets),
        st.tuples(st.just("tick"), st.floats(0.0, 0.5)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("capacity"), st.integers(0, 4), st.booleans()),
    ),
    max_size=80,
)
POLICY = Policy(aging_step_s=0.4, max_queued=12, max_queued_tokens=2000, default_deadline_s=3.0, lease_s=2.0)


class Run:
    """Drives a queue through a list of operations and records everything it says."""

    def __init__(self, policy: Policy = POLICY, queue: type[Queue] = Queue) -> None:
        self.q = queue(policy, limit=2)
        self.now = 0.0
        self.n = 0
        self.arrived: dict[str, float] = {}
        self.asked: dict[str, str] = {}
        self.outcomes: dict[str, list[Event]] = {}
        self.released: dict[str, int] = {}
        self.demoted: dict[str, float] = {}
        self.grants: list[tuple[float, Granted, list[str]]] = []

    def record(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, Demoted):
                assert e.id not in self.demoted, "demoted twice"
                self.demoted[e.id] = self.now
            else:
                self.outcomes.setdefault(e.id, []).append(e)
            if isinstance(e, Granted):
                self.grants.append((self.now, e, list(self.q.waiting)))
        assert len(self.q.waiting) <= self.q.policy.max_queued
        assert self.q.queued_tokens <= self.q.policy.max_queued_tokens
        assert self.q.queued_tokens == sum(w.ticket.tokens for w in self.q.waiting.values())

    def apply(self, op: tuple) -> None:  # type: ignore[type-arg]
        kind = op[0]
        if kind == "offer":
            cls, urgent, tokens = op[1]
            id = f"r{self.n}"
            self.n += 1
            self.arrived[id], self.asked[id] = self.now, cls
            self.record(self.q.offer(Ticket(id, cls, urgent, tokens), self.now))
        elif kind == "tick":
            self.now += op[1]
            self.record(self.q.poll(self.now))
        elif kind == "release":
            held = sorted(self.q.held)
            if held:
                id = held[op[1] % len(held)]
                if self.q.release(id, self.now):
                    self.released[id] = self.released.get(id, 0) + 1
                assert not self.q.release(id, self.now)
        elif kind == "cancel":
            waiting = sorted(self.q.waiting)
            if waiting:
                id = waiting[op[1] % len(waiting)]
                assert self.q.cancel(id, self.now)
                self.outcomes.setdefault(id, []).append(Refused(id, "timed_out", 0.0, "cancelled"))
        else:
            self.q.set_capacity(op[1], op[2])
            self.record(self.q.poll(self.now))

    def drain(self) -> None:
        """No more arrivals: release everything as it is granted until the queue is empty."""
        self.q.set_capacity(max(self.q.limit, 1), pressure=False)
        for _ in range(10_000):
            if not self.q.waiting:
                break
            self.now += 0.05
            self.record(self.q.poll(self.now))
            for id in list(self.q.held):
                assert self.q.release(id, self.now)
                self.released[id] = self.released.get(id, 0) + 1
        self.now += self.q.policy.lease_s + 1
        self.record(self.q.poll(self.now))


@settings(max_examples=300, deadline=None)
@given(ops)
def test_every_request_gets_exactly_one_outcome_and_every_grant_ends_once(script: list) -> None:  # type: ignore[type-arg]
    run = Run()
    for op in script:
        run.apply(op)
    run.drain()
    assert not run.q.waiting and not run.q.held
    for id in run.arrived:
        outcome = run.outcomes.get(id, [])
        assert len(outcome) in (1, 2), (id, outcome)
        first = outcome[0]
        if isinstance(first, Granted):
            ends = run.released.get(id, 0) + sum(isinstance(e, Expired) for e in outcome[1:])
            assert ends == 1 and len(outcome) == 1 + (run.released.get(id, 0) == 0)
        else:
            assert len(outcome) == 1 and isinstance(first, Refused)


class AlwaysQueued(Queue):
    """The queue without its at-once grant: every request joins the queue, `poll` grants it."""

    def _grantable_now(self, *args: object) -> bool:
        return False


@settings(max_examples=300, deadline=None)
@given(ops)
def test_granting_an_uncontended_request_at_once_changes_no_outcome(script: list) -> None:  # type: ignore[type-arg]
    fast, queued = Run(), Run(queue=AlwaysQueued)
    for op in script:
        fast.apply(op)
        queued.apply(op)
        assert fast.outcomes == queued.outcomes and fast.demoted == queued.demoted
        assert fast.q.held == queued.q.held and fast.q.waiting == queued.q.waiting


@settings(max_examples=300, deadline=None)
@given(ops)
def test_demotion_happens_after_max_wait_and_only_then(script: list) -> None:  # type: ignore[type-arg]
    run = Run()
    for op in script:
        run.apply(op)
        for w in run.q.waiting.values():
            late = run.now - w.arrived >= POLICY.max_wait_s
            if run.asked[w.ticket.id] != "standard":
                polled = op[0] not in ("release", "cancel")  # the others poll, which demotes
                if polled and late and run.q.floods(run.asked[w.ticket.id], run.now):
                    assert w.demoted
                assert not w.demoted or late
                assert w.cls == ("standard" if w.demoted else run.asked[w.ticket.id])
    for id, at in run.demoted.items():
        assert at - run.arrived[id] >= POLICY.max_wait_s
        assert run.asked[id] in ("vip", "premium")
    for _, g, _ in run.grants:
        assert g.demoted == (g.id in run.demoted)
        assert g.cls == ("standard" if g.demoted else g.asked)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_priority_order_and_no_starvation(script: list) -> None:  # type: ignore[type-arg]
    """Each grant is the best-ranked eligible request; a fully aged one is passed only by older ones."""
    policy = replace(POLICY, default_deadline_s=1e9, batch_window_s={c: 0.0 for c in CLASSES})
    run = Run(policy)
    full_age = WORST_BAND * policy.aging_step_s
    for op in script:
        waiting_before = {id: (w.cls, w.ticket.urgent, w.arrived) for id, w in run.q.waiting.items()}
        before = len(run.grants)
        run.apply(op)
        for now, g, _ in run.grants[before:]:
            if g.id not in waiting_before:
                continue  # granted on arrival, with the queue empty of eligible work
            _, g_urgent, g_arrived = waiting_before[g.id]
            g_band = max(0, band_of(g.cls, g_urgent) - int((now - g_arrived) / policy.aging_step_s))
            for id, (cls, urgent, arrived) in waiting_before.items():
                if id == g.id or id not in run.q.waiting:
                    continue
                if run.q.pressure and now - arrived < policy.pressure_hold_s:
                    continue  # not yet eligible
                cls = "standard" if now - arrived >= policy.max_wait_s else cls
                band = max(0, band_of(cls, urgent) - int((now - arrived) / policy.aging_step_s))
                assert (g_band, g_arrived) <= (band, arrived), (g, id)
                if now - arrived >= full_age:
                    assert g_arrived <= arrived, "a fully aged request was passed by a younger one"
    run.drain()
    assert not run.q.waiting


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CLASSES), st.booleans()), min_size=1, max_size=30))
def test_simultaneous_arrivals_are_served_by_band_then_arrival(arrivals: list[tuple[str, bool]]) -> None:
    q = Queue(NO_WINDOWS, limit=0)
    for i, (cls, urgent) in enumerate(arrivals):
        q.offer(Ticket(f"r{i}", cls, urgent), now=i * 0.001)
    q.set_capacity(len(arrivals), pressure=False)
    order = granted(q.poll(0.05))
    expected = sorted(range(len(arrivals)), key=lambda i: (band_of(*arrivals[i]), i))
    assert order == [f"r{i}" for i in expected]


@settings(max_examples=100, deadline=None)
@given(
    flood=st.lists(st.tuples(st.sampled_from(CLASSES), st.booleans()), min_size=1, max_size=8),
    service_s=st.floats(0.02, 0.3),
    per_service=st.integers(2, 5),
)
def test_a_flood_of_higher_classes_does_not_starve_an_old_request(
    flood: list[tuple[str, bool]], service_s: float, per_service: int
) -> None:
    """One slot, arrivals faster than it drains: the first waiter still gets in once fully aged."""
    policy = replace(POLICY, default_deadline_s=1e9, max_queued=10_000, max_queued_tokens=10**9)
    q = Queue(policy, limit=1)
    full_age = WORST_BAND * policy.aging_step_s
    q.offer(Ticket("busy", "vip"), now=0.0)
    q.offer(Ticket("victim", "standard"), now=0.0)
    now, gap, i, next_release = 0.0, service_s / per_service, 0, service_s
    victim_at = None
    while now < full_age + 3 * service_s + 1 and victim_at is None:
        now += gap
        cls, urgent = flood[i % len(flood)]
        events = q.offer(Ticket(f"f{i}", cls, urgent), now)
        i += 1
        if now >= next_release:
            for id in list(q.held):
                q.release(id, now)
            next_release = now + service_s
            events += q.poll(now)
        if "victim" in granted(events):
            victim_at = now
    assert victim_at is not None and victim_at <= full_age + 2 * service_s + 2 * gap + 0.06


def test_a_late_vip_keeps_its_place_when_vip_does_not_flood_the_pool() -> None:
    """Every slot busy for a moment: a vip request that waited past max_wait_s still goes
    before standard requests that arrived earlier (vip arrives slower than the pool serves)."""
    q = Queue(NO_WINDOWS, limit=2)
    now = 0.0
    for i in range(8):  # measured: 2 slots of 0.5 s, about 4 releases a second
        q.offer(Ticket(f"w{i}"), now)
        now += 0.5
        q.release(f"w{i}", now)
    q.offer(Ticket("busy0"), now)
    q.offer(Ticket("busy1"), now)
    q.offer(Ticket("older-standard"), now)
    q.offer(Ticket("vip", "vip"), now + 0.01)
    assert not [e for e in q.poll(now + 0.4) if isinstance(e, Demoted)]
    assert q.release("busy0", now + 0.45)
    assert granted(q.poll(now + 0.45)) == ["vip"]
