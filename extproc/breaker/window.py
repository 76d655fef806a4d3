"""Rolling latency and outcome windows as fixed-bucket histograms in time slices.

Nothing keeps a list of samples: a slice is a sparse map of latency-bucket counts plus an
error count, and slices from any number of processes merge by adding counts. P95 is read
from the merged buckets; each bucket spans ~10%, so P95 is exact to within one bucket
(the upper bound is reported: conservative for a "too slow" decision).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MIN_LATENCY_S = 0.001
GROWTH = 1.1
BUCKETS = 150  # 1 ms · 1.1^149 ≈ 1,500 s: every latency an LLM call can have


def bucket_of(seconds: float) -> int:
    """Index of the bucket holding `seconds` (bucket i covers (bound(i-1), bound(i)])."""
    if seconds <= MIN_LATENCY_S:
        return 0
    index = math.ceil(math.log(seconds / MIN_LATENCY_S, GROWTH) - 1e-9)
    return min(max(index, 0), BUCKETS - 1)


def bound(index: int) -> float:
    """Upper bound of bucket `index`, in seconds."""
    return float(MIN_LATENCY_S * GROWTH**index)


@dataclass
class Slice:
    """Counts of one time slice: latency buckets of the successes, and the errors."""

    buckets: dict[int, int] = field(default_factory=dict)
    errors: int = 0

    def add(self, latency_s: float | None, error: bool) -> None:
        if error:
            self.errors += 1
        if latency_s is not None and not error:
            index = bucket_of(latency_s)
            self.buckets[index] = self.buckets.get(index, 0) + 1

    def merge(self, other: Slice) -> None:
        for index, count in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + count
        self.errors += other.errors

    @property
    def samples(self) -> int:
        return sum(self.buckets.values()) + self.errors


@dataclass(frozen=True)
class Stats:
    """What the breaker decides on: P95 of the successes, error share of all outcomes."""

    samples: int = 0
    errors: int = 0
    p95_s: float | None = None
    window_s: float = 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.samples if self.samples else 0.0

    @property
    def throughput(self) -> float:
        """Completed calls per second over the window."""
        return self.samples / self.window_s if self.window_s > 0 else 0.0


def quantile(buckets: Mapping[int, int], q: float) -> float | None:
    """The upper bound of the bucket where the q-quantile falls; None without samples."""
    total = sum(buckets.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen >= rank:
            return bound(index)
    return bound(max(buckets))


def summarize(slices: Iterable[Slice], window_s: float, overdue: Iterable[float] = ()) -> Stats:
    """The window's stats; `overdue`: ages of calls still waiting past the open threshold.

    A call that hangs has no latency yet, but it is at least as slow as its age: counting it
    as such lets the breaker see a hang while it happens, not after it ends.
    """
    total = Slice()
    for part in slices:
        total.merge(part)
    for age in overdue:
        total.add(age, False)
    return Stats(total.samples, total.errors, quantile(total.buckets, 0.95), window_s)


class Window:
    """One process's slices of one pool, plus the deltas not yet shared.

    Slice `k` covers [k·width, (k+1)·width) of wall-clock time, the same grid in every
    process (same config), so slices with the same index merge across processes.
    """

    def __init__(self, window_s: float, slices: int) -> None:
        self.window_s = window_s
        self.width = window_s / slices
        self.slices: dict[int, Slice] = {}
        self.pending: dict[int, Slice] = {}

    def index(self, now: float) -> int:
        return math.floor(now / self.width)

    def add(self, now: float, latency_s: float | None, error: bool) -> None:
        k = self.index(now)
        self.slices.setdefault(k, Slice()).add(latency_s, error)
        self.pending.setdefault(k, Slice()).add(latency_s, error)

    def span(self, now: float, since: float) -> range:
        """Slice indexes in the window that end after `since` (the state's entry time)."""
        last = self.index(now)
        first = max(last - math.ceil(self.window_s / self.width) + 1, self.index(since))
        return range(first, last + 1)

    def covered_s(self, now: float, since: float) -> float:
        return max(min(self.window_s, now - since), self.width)

    def stats(self, now: float, since: float, overdue: Iterable[float] = ()) -> Stats:
        self.prune(now)
        span = self.span(now, since)
        slices = (self.slices[k] for k in span if k in self.slices)
        return summarize(slices, self.covered_s(now, since), overdue)

    def take_pending(self) -> dict[int, Slice]:
        pending, self.pending = self.pending, {}
        return pending

    def restore_pending(self, pending: dict[int, Slice], now: float) -> None:
        """Deltas that could not be shared wait for the next try while still in the window."""
        for k, part in pending.items():
            self.pending.setdefault(k, Slice()).merge(part)
        self.prune(now)

    def prune(self, now: float) -> None:
        oldest = self.index(now) - math.ceil(self.window_s / self.width)
        for store in (self.slices, self.pending):
            for k in [k for k in store if k < oldest]:
                del store[k]
