"""GCRA (the generic cell rate algorithm) and the repeated-prompt window, as pure functions.

Time is integer microseconds, so every value is exact both here and in Redis's Lua (whose
numbers are doubles: integers up to 2**53, about 285 years of microseconds). `ratelimit.lua`
runs the same arithmetic in the same order; a test feeds both the same random sequences.

A bucket's state is its theoretical arrival time (TAT): when the bucket would be full again.
A request of `cost` is admitted when `max(tat, now) + cost*interval - burst*interval <= now`,
so over any span of `t` seconds a bucket admits at most `rate*t + burst` requests.
"""

from __future__ import annotations

import math
from typing import NamedTuple

US = 1_000_000


class Decision(NamedTuple):
    allowed: bool
    state: int | None  # the new TAT, or None when nothing changes (denied)
    remaining: int  # requests that would still be admitted right now
    retry_after: int  # microseconds until this request would be admitted (0 when allowed)
    reset_after: int  # microseconds until the bucket is full again


def interval_us(rate: float) -> int:
    """Microseconds per request; rounded up, so the bucket never runs faster than `rate`."""
    return max(1, math.ceil(US / rate))


def take(state: int | None, now: int, rate: float, burst: int, cost: int = 1) -> Decision:
    """Try to take `cost` requests from a bucket refilling at `rate`/s and holding `burst`."""
    return take_interval(state, now, interval_us(rate), burst * interval_us(rate), cost)


def take_interval(state: int | None, now: int, interval: int, tolerance: int, cost: int) -> Decision:
    """`take` with the interval and tolerance (burst × interval) already in microseconds."""
    tat = now if state is None or state < now else state
    new_tat = tat + interval * cost
    allow_at = new_tat - tolerance
    if allow_at > now:
        remaining = max(0, math.floor((tolerance - (tat - now)) / interval))
        return Decision(False, None, remaining, allow_at - now, tat - now)
    remaining = max(0, math.floor((tolerance - (new_tat - now)) / interval))
    return Decision(True, new_tat, remaining, 0, new_tat - now)


class Repeat(NamedTuple):
    tripped: bool  # this arrival is one more than `limit` within the window
    history: tuple[int, ...]  # arrival times still inside the window, oldest first


def note_arrival(history: tuple[int, ...], now: int, window: int, limit: int) -> Repeat:
    """Record one arrival of a prompt; trip when `limit` arrivals are already in the window."""
    recent = tuple(t for t in history if t > now - window)
    if len(recent) >= limit:
        return Repeat(True, ())
    return Repeat(False, (*recent, now))
