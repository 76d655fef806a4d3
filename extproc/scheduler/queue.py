"""The admission queue of one pool: who gets the next slot, and who is told no.

Pure: no I/O and no clock; every call takes `now` (seconds, monotonic) and returns the
events it caused. The scheduler service and the gate's embedded mode both drive it.

Order. A waiting request sits in a *band*: 0 vip-urgent, 1 vip, 2 premium-urgent,
3 premium, 4 standard-urgent, 5 standard. The lowest band goes first, then arrival.
Aging lifts a request one band per `aging_step_s` waited, so after `5 * aging_step_s`
it is in band 0 and only older requests go before it: nothing starves.
Demotion: while a high class floods the pool (it arrives faster than the pool releases
slots, or nothing was measured yet), a vip or premium request of it still waiting after
`max_wait_s` is demoted to standard, so the flood cannot push its own fresh arrivals behind
requests that are already late; aging still bounds its wait. Without a flood a late vip
request keeps its place: it is late only because every slot was busy, and behind the
standard requests that waited longer it would wait seconds more.

Batch windows. While the pool is full (or under memory pressure), requests of a class are
released together: the first arrival of a class opens a window of `batch_window_s[class]`;
everything of that class arriving inside it becomes eligible when it closes. A request
that finds a free slot and nobody waiting goes at once: vLLM batches continuously, so
holding it back would only add latency. Under memory pressure only requests that have waited
`pressure_hold_s` are released, so the pool gets fewer, larger batches.

Overload. The queue is bounded by count and by estimated tokens; a newcomer that ranks
above the worst waiting request evicts it, otherwise it is refused. A newcomer whose
ETA (`estimate.py`: the queue ahead and the pool's recent service times, else the measured
drain rate) exceeds its deadline, or whose ETA plus the pool's service time passes the
point where its client gives up (`answer_by_s`), is refused at once; a waiting request whose
ETA grows past what is left of its deadline (the pool slowed down, higher classes arrived) is refused as
soon as that shows (checked every `recheck_s`), not at its deadline.

Probe slots. The capacity source raises the limit a step above what the pool has been seen
to run without queueing, to find out whether it can run more (`probing` slots); a request
admitted there may wait a whole service time inside the model server before its own. Such a
slot goes only to a request whose client waits at least two service times (`answer_by_s`);
the others wait for, and are estimated against, the proven slots.

Preemption. On a pool whose model server schedules by priority and preempts lower-priority
running work (vLLM `--scheduling-policy priority`), the top class may also take
`preempt_slots` slots over the limit: it starts at once instead of waiting for a release,
and the request it displaces waits inside the model server instead.

Reserve. While top-tier (vip) traffic flows, a few slots (`estimate.reserve_slots`) are
open only to requests ranked in the top tier's bands (vip, or aged up to it), so a vip
arrival finds a free slot instead of waiting for the next release. The best-ranked
eligible request still goes first: when it may not take a reserved slot, nobody behind it
may either.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Literal

from .estimate import MIN_TURN, reserve_slots, service_time, wait_estimate

CLASSES: tuple[str, ...] = ("vip", "premium", "standard")
HIGH_CLASSES = frozenset({"vip", "premium"})
WORST_BAND = 2 * len(CLASSES) - 1
Reason = Literal["queue_full", "deadline", "evicted", "timed_out"]


@dataclass(frozen=True)
class Policy:
    batch_window_s: Mapping[str, float] = field(
        default_factory=lambda: {"vip": 0.002, "premium": 0.010, "standard": 0.050}
    )
    max_wait_s: float = 0.3
    aging_step_s: float = 5.0
    max_queued: int = 1024
    max_queued_tokens: int = 4_000_000
    default_deadline_s: float = 10.0
    lease_s: float = 120.0
    pressure_hold_s: float = 0.2
    drain_window_s: float = 10.0
    min_drain_samples: int = 4
    # Slots kept for the top tier: its measured concurrency times reserve_factor (0: none),
    # at most reserve_max_share of the pool.
    reserve_factor: float = 1.5
    reserve_max_share: float = 0.25
    recheck_s: float = 0.05  # how often waiting requests' ETAs are checked against their deadlines
    service_samples: int = 256  # recent slot hold times kept: the estimate averages the last `limit`
    # Top-class requests granted over the limit when the pool preempts lower-priority work (0: none).
    preempt_slots: int = 0


@dataclass(frozen=True)
class Ticket:
    id: str
    cls: str = "standard"
    urgent: bool = False
    tokens: int = 0
    deadline_s: float | None = None  # how long the caller will wait; None: the policy's default
    # The caller's client gives up this long after sending (None: unknown): a slot that leaves
    # less than the pool's service time before then would compute an answer nobody reads.
    answer_by_s: float | None = None


@dataclass(frozen=True)
class Granted:
    id: str
    cls: str  # the class it was granted in (standard when demoted)
    asked: str
    waited_s: float
    demoted: bool


@dataclass(frozen=True)
class Refused:
    id: str
    reason: Reason
    eta_s: float
    cls: str


@dataclass(frozen=True)
class Demoted:
    id: str
    asked: str


@dataclass(frozen=True)
class Expired:
    """A grant whose lease ran out before it was released or renewed."""

    id: str
    cls: str


Event = Granted | Refused | Demoted | Expired


@dataclass
class _Waiting:
    ticket: Ticket
    seq: int
    arrived: float
    eligible_at: float
    deadline_at: float
    cls: str
    demoted: bool = False


@dataclass(frozen=True)
class _View:
    """What the estimates need, computed once per decision."""

    service_s: float | None
    reserved: int
    arrivals_per_s: dict[str, float]
    held_by_the_rest: int  # slots held by grants outside the top bands
    held_ages: tuple[float, ...]  # how long each granted request has run


@dataclass
class _Held:
    cls: str
    tokens: int
    lease_until: float
    granted_at: float = 0.0
    top: bool = False  # granted in the top tier's bands: counts against the reserve, not the rest


def band_of(cls: str, urgent: bool) -> int:
    return 2 * CLASSES.index(cls) + (0 if urgent else 1)


TOP_BANDS = band_of(CLASSES[0], False)  # bands that may take reserved slots


class Queue:
    def __init__(self, policy: Policy | None = None, limit: int = 1) -> None:
        self.policy = policy or Policy()
        self.limit = limit
        self.probing = 0  # the top slots of `limit` the pool may queue instead of running
        self.pressure = False
        self.waiting: dict[str, _Waiting] = {}
        self.held: dict[str, _Held] = {}
        self.queued_tokens = 0
        self._seq = 0
        self._window_close: dict[str, float] = {}
        self._releases: deque[float] = deque(maxlen=512)
        self._arrivals: dict[str, deque[float]] = {c: deque(maxlen=512) for c in CLASSES}
        self._first_arrival: float | None = None
        self._first_release: float | None = None
        self._service: deque[float] = deque(maxlen=self.policy.service_samples)
        self._next_recheck = -math.inf

    # -- ordering -------------------------------------------------------------------------

    def _key(self, w: _Waiting, now: float) -> tuple[int, float, int]:
        aged = int(max(0.0, now - w.arrived) / self.policy.aging_step_s)
        return (max(0, band_of(w.cls, w.ticket.urgent) - aged), w.arrived, w.seq)

    def _eligible(self, w: _Waiting, now: float) -> bool:
        if now < w.eligible_at:
            return False
        return not self.pressure or now - w.arrived >= self.policy.pressure_hold_s

    # -- the caller's operations ----------------------------------------------------------

    def offer(self, ticket: Ticket, now: float) -> list[Event]:
        """A request asks for a slot; it may be granted or refused at once."""
        if ticket.id in self.waiting or ticket.id in self.held:
            return []
        if ticket.cls not in CLASSES:
            ticket = replace(ticket, cls="standard")
        events: list[Event] = self.poll(now)
        self._seq += 1
        self._arrivals[ticket.cls].append(now)
        if self._first_arrival is None:
            self._first_arrival = now
        view = self._view(now)  # nothing below changes what it sums up until the entry joins
        free = self.free(band_of(ticket.cls, ticket.urgent), view, self._preempts(ticket.cls))
        if len(self.waiting) < free and not self.pressure:
            close = now  # a free slot and nobody waiting for it: holding this request gains nothing
        else:
            close = self._window_close.get(ticket.cls, -math.inf)
            if close <= now:
                close = self._window_close[ticket.cls] = now + self.policy.batch_window_s.get(ticket.cls, 0.0)
        deadline = self.policy.default_deadline_s if ticket.deadline_s is None else ticket.deadline_s
        entry = _Waiting(ticket, self._seq, now, close, now + deadline, ticket.cls)
        # Nobody waiting and a slot it may take: granted here, as `poll` would, without queueing.
        at_once = not self.waiting and self._grantable_now(entry, now, view)
        eta = 0.0 if at_once else self.eta(entry, now, view)
        if self._too_late(entry, eta, now, view.service_s):
            return [*events, Refused(ticket.id, "deadline", eta, ticket.cls)]
        evicted = self._make_room(entry, now)
        if evicted is None:
            return [*events, Refused(ticket.id, "queue_full", eta, ticket.cls)]
        events += evicted
        if at_once:
            return [*events, self._grant(entry, now)]
        self.waiting[ticket.id] = entry
        self.queued_tokens += ticket.tokens
        return events + self.poll(now)

    def _grantable_now(self, entry: _Waiting, now: float, view: _View) -> bool:
        """Whether `poll` would grant `entry`, alone in the queue, at once (ETA 0)."""
        if self.pressure or entry.eligible_at > now or entry.deadline_at <= now:
            return False
        return self.policy.max_wait_s > 0 and self._may_take_a_slot(entry, now, view)

    def _grant(self, w: _Waiting, now: float) -> Granted:
        lease, top = now + self.policy.lease_s, self._key(w, now)[0] <= TOP_BANDS
        self.held[w.ticket.id] = _Held(w.cls, w.ticket.tokens, lease, now, top)
        return Granted(w.ticket.id, w.cls, w.ticket.cls, now - w.arrived, w.demoted)

    def cancel(self, id: str, now: float) -> bool:
        """The caller went away while waiting: leave the queue at once."""
        w = self.waiting.pop(id, None)
        if w is None:
            return False
        self.queued_tokens -= w.ticket.tokens
        return True

    def release(self, id: str, now: float) -> bool:
        """Give a granted slot back; True only the first time for a held grant."""
        held = self.held.pop(id, None)
        if held is None:
            return False
        self._service.append(max(0.0, now - held.granted_at))
        self._releases.append(now)
        if self._first_release is None:
            self._first_release = now
        return True

    def renew(self, ids: list[str], now: float) -> list[str]:
        """Extend leases; returns the ids this queue does not hold."""
        unknown = []
        for id in ids:
            held = self.held.get(id)
            if held is None:
                unknown.append(id)
            else:
                held.lease_until = now + self.policy.lease_s
        return unknown

    def set_capacity(self, limit: int, pressure: bool, probing: int = 0) -> None:
        self.limit = max(0, limit)
        self.pressure = pressure
        self.probing = min(max(0, probing), self.limit)

    # -- time passes ----------------------------------------------------------------------

    def poll(self, now: float) -> list[Event]:
        """Expire leases, demote, refuse the late, and grant while there is room."""
        events: list[Event] = []
        for id, held in list(self.held.items()):
            if held.lease_until <= now:
                del self.held[id]
                events.append(Expired(id, held.cls))
        floods: dict[str, bool] = {}
        for w in list(self.waiting.values()):
            late = now - w.arrived >= self.policy.max_wait_s
            if w.cls in HIGH_CLASSES and late and w.cls not in floods:
                floods[w.cls] = self.floods(w.cls, now)  # once per class and poll
            if w.cls in HIGH_CLASSES and late and floods[w.cls]:
                w.cls, w.demoted = "standard", True
                events.append(Demoted(w.ticket.id, w.ticket.cls))
            if now >= w.deadline_at:
                self.cancel(w.ticket.id, now)
                events.append(Refused(w.ticket.id, "timed_out", self.eta(w, now), w.ticket.cls))
        if self.waiting and self._service and now >= self._next_recheck:
            self._next_recheck = now + self.policy.recheck_s
            events += self._shed_the_late(now)
        view = self._view(now) if self.waiting else None
        while len(self.held) < self.limit + self._over() and view is not None:
            best = self._next_grant(now, view)
            if best is None:
                break
            self.cancel(best.ticket.id, now)
            events.append(self._grant(best, now))
            if not self.held[best.ticket.id].top:
                view = replace(view, held_by_the_rest=view.held_by_the_rest + 1)
        return events

    def _next_grant(self, now: float, view: _View) -> _Waiting | None:
        """The best-ranked eligible request that may take the next slot. When only reserved
        slots are left and it may not take one, nobody behind it may either. A probe slot goes
        to the best-ranked request that can afford to wait in the pool's own queue."""
        ready = [w for w in self.waiting.values() if self._eligible(w, now)]
        if not ready:
            return None
        probe = self.limit - self.probing <= len(self.held) < self.limit
        over = len(self.held) >= self.limit  # only the top class may go, preempting
        ranked = (
            sorted(ready, key=lambda w: self._key(w, now))
            if probe or over
            else [min(ready, key=lambda w: self._key(w, now))]
        )
        for w in ranked:
            if self.free(self._key(w, now)[0], view, self._preempts(w.cls)) <= 0:
                if over:
                    continue
                return None
            if not probe or self._affords_probe(w, now, view.service_s):
                return w
        return None

    def _preempts(self, cls: str) -> bool:
        """Whether a request of `cls` may be granted over the limit: the top class, on a pool
        that preempts lower-priority work to run it."""
        return cls == CLASSES[0] and self._over() > 0

    def _over(self) -> int:
        """Slots over the limit for the top class (none while the pool is closed)."""
        return self.policy.preempt_slots if self.limit > 0 else 0

    def _may_take_a_slot(self, w: _Waiting, now: float, view: _View) -> bool:
        """Whether a slot open now is one `w` may take (not reserved for others, not a probe it
        cannot afford)."""
        if self.free(self._key(w, now)[0], view, self._preempts(w.cls)) <= 0:
            return False
        proven = len(self.held) < self.limit - self.probing or len(self.held) >= self.limit
        return proven or self._affords_probe(w, now, view.service_s)

    def _affords_probe(self, w: _Waiting, now: float, service_s: float | None) -> bool:
        """A probe slot may leave the request waiting a whole service time in the pool's queue
        before its own: only a request whose client waits that long may take one."""
        if self._preempts(w.cls):
            return True  # the pool runs it ahead of lower classes: it never waits a whole service
        by = w.ticket.answer_by_s
        return by is None or service_s is None or now - w.arrived + 2 * service_s <= by

    def next_wakeup(self, now: float) -> float | None:
        """The next time `poll` could change something without a call in between."""
        times = [h.lease_until for h in self.held.values()]
        view = self._view(now) if self.waiting and len(self.held) < self.limit + self._over() else None
        for w in self.waiting.values():
            times.append(w.deadline_at)
            if w.cls in HIGH_CLASSES:
                times.append(w.arrived + self.policy.max_wait_s)
            if self._service:  # something measured: ETAs can pass deadlines before the deadlines do
                times.append(self._next_recheck)
            if view is not None and self._may_take_a_slot(w, now, view):
                hold = w.arrived + self.policy.pressure_hold_s if self.pressure else w.eligible_at
                times.append(max(w.eligible_at, hold))
        later = [t for t in times if t > now]
        if len(later) < len(times):  # something is due now
            return now
        return min(later, default=None)

    # -- estimates ------------------------------------------------------------------------

    def drain_per_s(self, now: float) -> float | None:
        """Releases per second over the last `drain_window_s`; None until measured."""
        window = self.policy.drain_window_s
        while self._releases and self._releases[0] < now - window:
            self._releases.popleft()
        if self._first_release is None or len(self._releases) < self.policy.min_drain_samples:
            return None
        span = min(window, now - self._first_release)
        return len(self._releases) / max(span, 0.5)

    def service_s(self, now: float) -> float | None:
        """Seconds a slot is held (recent releases, or longer when running requests show a slowdown)."""
        return service_time(self._last_turn(), [now - h.granted_at for h in self.held.values()], self.limit)

    def _last_turn(self) -> list[float]:
        """The newest `limit` slot hold times (at least MIN_TURN), newest first."""
        return list(islice(reversed(self._service), max(self.limit, MIN_TURN)))

    def floods(self, cls: str, now: float) -> bool:
        """Whether `cls` arrives faster than the pool releases slots (True before anything was
        measured: a closed or unmeasured pool cannot serve anyone in time)."""
        service = self.service_s(now)
        if service is None or self.limit <= 0:
            return True
        return self._arrival_rate((cls,), now) >= self.limit / max(service, 1e-6)

    def _view(self, now: float) -> _View:
        p = self.policy
        rates = {c: self._arrival_rate((c,), now) for c in CLASSES}
        ages = tuple(now - h.granted_at for h in self.held.values())
        service = service_time(self._last_turn(), ages, self.limit)
        top = rates[CLASSES[0]]
        reserved = reserve_slots(self.limit, top, service, p.reserve_factor, p.reserve_max_share)
        return _View(service, reserved, rates, sum(1 for h in self.held.values() if not h.top), ages)

    def reserved(self, now: float) -> int:
        """Slots only the top tier's bands may take now."""
        return self._view(now).reserved

    def free(self, band: int, view: _View, preempts: bool = False) -> int:
        """Slots a request of `band` (after aging) may take now: the rest may hold all but the
        reserve; one that `preempts` also the slots over the limit."""
        free = self.limit + (self._over() if preempts else 0) - len(self.held)
        if band > TOP_BANDS:
            free = min(free, self.limit - view.reserved - view.held_by_the_rest)
        return max(0, free)

    def eta(self, entry: _Waiting, now: float, view: _View | None = None) -> float:
        """Seconds until `entry` would likely get a slot; 0 when it cannot be told yet."""
        key = self._key(entry, now)
        ahead = sum(1 for w in self.waiting.values() if w is not entry and self._key(w, now) < key)
        return self._eta(entry, ahead, now, view or self._view(now))

    def _eta(self, entry: _Waiting, ahead: int, now: float, view: _View) -> float:
        start = max(0.0, entry.eligible_at - now)
        if self.pressure:
            start = max(start, entry.arrived + self.policy.pressure_hold_s - now)
        # Slots it may take: all of the pool's, or only the proven ones when it cannot afford a probe.
        preempts = self._preempts(entry.cls)
        if preempts:
            usable = self.limit + self._over()
        elif self._affords_probe(entry, now, view.service_s):
            usable = self.limit
        else:
            usable = self.limit - self.probing
        free = max(0, min(self.free(self._key(entry, now)[0], view, preempts), usable - len(self.held)))
        ahead += max(0, len(self.held) - usable)  # the pool shrank: those releases free nothing
        behind_slots = ahead + 1 - free
        if behind_slots <= 0:
            return start
        # Higher classes arriving meanwhile will go first: only what they leave drains this one.
        higher = sum(view.arrivals_per_s[c] for c in CLASSES[: CLASSES.index(entry.cls)])
        wait = wait_estimate(ahead, free, self.limit, view.service_s, higher, view.held_ages)
        if wait is not None:
            return max(start, wait)
        rate = self.drain_per_s(now)
        if rate is None:
            return start
        left = max(0.1 * rate, rate - higher)
        return max(start, behind_slots / left)

    def _shed_the_late(self, now: float) -> list[Event]:
        """Refuse the waiting requests whose ETA already passes what is left of their deadline."""
        ranked = sorted(self.waiting.values(), key=lambda w: self._key(w, now))
        view = self._view(now)
        late = []
        for ahead, w in enumerate(ranked):
            eta = self._eta(w, ahead, now, view)
            if self._too_late(w, eta, now, view.service_s):
                late.append(Refused(w.ticket.id, "deadline", eta, w.ticket.cls))
        for e in late:
            self.cancel(e.id, now)
        return list(late)

    @staticmethod
    def _too_late(w: _Waiting, eta: float, now: float, service_s: float | None) -> bool:
        """Its slot would come after its deadline, or too late for the answer to reach its
        client before the client gives up (`answer_by_s`)."""
        if eta > w.deadline_at - now:
            return True
        by = w.ticket.answer_by_s
        return by is not None and service_s is not None and now + eta + service_s > w.arrived + by

    def _arrival_rate(self, classes: tuple[str, ...], now: float) -> float:
        if not classes or self._first_arrival is None:
            return 0.0
        window = self.policy.drain_window_s
        span = max(min(window, now - self._first_arrival), 0.5)
        count = 0
        for c in classes:
            times = self._arrivals[c]
            while times and times[0] < now - window:  # what left the window never comes back
                times.popleft()
            count += len(times)
        return count / span

    def eta_for(self, cls: str, now: float, urgent: bool = False) -> float:
        """The ETA a new request of `cls` would be given now."""
        probe = _Waiting(Ticket("", cls, urgent), self._seq + 1, now, now, math.inf, cls)
        return self.eta(probe, now)

    def _make_room(self, entry: _Waiting, now: float) -> list[Event] | None:
        """Evict worse-ranked requests until `entry` fits; None when it does not rank high enough."""
        p = self.policy
        if entry.ticket.tokens > p.max_queued_tokens:
            return None
        key = self._key(entry, now)
        count, tokens = len(self.waiting) + 1, self.queued_tokens + entry.ticket.tokens
        worst_first = sorted(self.waiting.values(), key=lambda w: self._key(w, now), reverse=True)
        victims: list[_Waiting] = []
        for w in worst_first:
            if count <= p.max_queued and tokens <= p.max_queued_tokens:
                break
            if self._key(w, now) <= key:
                return None
            victims.append(w)
            count, tokens = count - 1, tokens - w.ticket.tokens
        if count > p.max_queued or tokens > p.max_queued_tokens:
            return None
        for w in victims:
            self.cancel(w.ticket.id, now)
        return [Refused(w.ticket.id, "evicted", self.eta(w, now), w.ticket.cls) for w in victims]

    # -- what an operator sees ------------------------------------------------------------

    def queued_by_class(self) -> dict[str, int]:
        counts = dict.fromkeys(CLASSES, 0)
        for w in self.waiting.values():
            counts[w.cls] += 1
        return counts

    def oldest_wait_by_class(self, now: float) -> dict[str, float]:
        oldest = dict.fromkeys(CLASSES, 0.0)
        for w in self.waiting.values():
            oldest[w.cls] = max(oldest[w.cls], now - w.arrived)
        return oldest
