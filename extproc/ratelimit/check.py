"""One request's rate-limit check across all its buckets, as plain data and one pure function.

Order (the Lua script follows it step by step): an active block answers at once; then the
prompt's arrival is recorded and may trip a new block; then every bucket is tried, and the
buckets are charged only when all of them admit the request (a denied request costs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from .gcra import US, Decision, interval_us, note_arrival, take_interval

Status = Literal["allowed", "limited", "blocked"]


@dataclass(frozen=True)
class BucketSpec:
    name: str  # which limit: tenant, user, ip, route
    key: str
    rate: float  # requests per second, sustained
    burst: int  # requests at once from a full bucket
    cost: int = 1

    @property
    def interval(self) -> int:
        return interval_us(self.rate)

    @property
    def tolerance(self) -> int:
        return self.burst * self.interval


@dataclass(frozen=True)
class RepeatSpec:
    key: str  # arrivals of one caller's prompt
    block_key: str  # the caller's block
    limit: int  # arrivals allowed in the window; one more trips the block
    window: int  # microseconds
    block: int  # microseconds
    info: str = ""  # shown in the admin listing


@dataclass(frozen=True)
class Check:
    buckets: tuple[BucketSpec, ...]
    repeat: RepeatSpec | None = None
    # Where the verdict is kept for a while: the same check run again (a retry after a lost
    # reply) returns it instead of charging the buckets twice. None: not kept.
    done_key: str | None = None


class Verdict(NamedTuple):
    status: Status
    decisions: tuple[Decision, ...]  # one per bucket; empty when blocked
    block_left: int = 0  # microseconds, when blocked
    newly_blocked: bool = False

    def tightest(self) -> int | None:
        """Index of the bucket to report: the longest wait if denied, else the least left."""
        if not self.decisions:
            return None
        if self.status == "limited":
            return max(range(len(self.decisions)), key=lambda i: self.decisions[i].retry_after)
        return min(range(len(self.decisions)), key=lambda i: self.decisions[i].remaining)


@dataclass(frozen=True)
class State:
    """What the store holds for one check; None or stale values mean "nothing yet"."""

    tats: tuple[int | None, ...]
    history: tuple[int, ...] = ()
    block_until: int | None = None


class Outcome(NamedTuple):
    verdict: Verdict
    tats: tuple[int, ...] | None  # new TATs to write, or None to leave the buckets alone
    history: tuple[int, ...] | None  # new arrivals to write, or None when not touched
    block_until: int | None  # a new block to write


def evaluate(check: Check, state: State, now: int) -> Outcome:
    history: tuple[int, ...] | None = None
    repeat = check.repeat
    if repeat is not None:
        if state.block_until is not None and state.block_until > now:
            return Outcome(Verdict("blocked", (), state.block_until - now), None, None, None)
        noted = note_arrival(state.history, now, repeat.window, repeat.limit)
        if noted.tripped:
            verdict = Verdict("blocked", (), repeat.block, newly_blocked=True)
            return Outcome(verdict, None, (), now + repeat.block)
        history = noted.history
    decisions = tuple(
        take_interval(tat, now, b.interval, b.tolerance, b.cost)
        for b, tat in zip(check.buckets, state.tats, strict=True)
    )
    if all(d.allowed for d in decisions):
        tats = tuple(d.state for d in decisions if d.state is not None)
        return Outcome(Verdict("allowed", decisions), tats, history, None)
    return Outcome(Verdict("limited", decisions), None, history, None)


def seconds(us: int) -> float:
    return us / US
