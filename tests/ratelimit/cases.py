"""One table of cases, run against the pure functions, the memory store and the Lua script.

Each case is a sequence of (now in µs, check, expected verdict); expected values are worked
out by hand from the algorithm, not taken from a run.
"""

from __future__ import annotations

from typing import NamedTuple

from extproc.ratelimit.check import BucketSpec, Check, RepeatSpec

S = 1_000_000


class Expect(NamedTuple):
    status: str
    buckets: tuple[tuple[bool, int, int, int], ...] = ()  # allowed, remaining, retry, reset
    block_left: int = 0
    newly: bool = False


def one(rate: float, burst: int, cost: int = 1, key: str = "k") -> Check:
    return Check((BucketSpec("tenant", key, rate, burst, cost),))


A = one(1, 3)
TWO = Check((BucketSpec("tenant", "t", 1, 2), BucketSpec("user", "u", 1, 1)))
REP = RepeatSpec("rep:{c}", "block:{c}", limit=2, window=S, block=5 * S, info="x")
REP_ONLY = Check((), REP)
REP_AND_BUCKET = Check((BucketSpec("tenant", "t", 1, 5),), REP)

CASES: dict[str, list[tuple[int, Check, Expect]]] = {
    "burst of 3 then one per second": [
        (0, A, Expect("allowed", ((True, 2, 0, 1 * S),))),
        (0, A, Expect("allowed", ((True, 1, 0, 2 * S),))),
        (0, A, Expect("allowed", ((True, 0, 0, 3 * S),))),
        (0, A, Expect("limited", ((False, 0, 1 * S, 3 * S),))),
        (S // 2, A, Expect("limited", ((False, 0, S // 2, 5 * S // 2),))),
        (S, A, Expect("allowed", ((True, 0, 0, 3 * S),))),
        (10 * S, A, Expect("allowed", ((True, 2, 0, 1 * S),))),
    ],
    "cost above one": [
        (0, one(10, 5, 3), Expect("allowed", ((True, 2, 0, 300_000),))),
        (0, one(10, 5, 3), Expect("limited", ((False, 2, 100_000, 300_000),))),
        (0, one(10, 5, 2), Expect("allowed", ((True, 0, 0, 500_000),))),
    ],
    "a rate that does not divide a second rounds the interval up": [
        (0, one(3, 1), Expect("allowed", ((True, 0, 0, 333_334),))),
        (333_333, one(3, 1), Expect("limited", ((False, 0, 1, 1),))),
        (333_334, one(3, 1), Expect("allowed", ((True, 0, 0, 333_334),))),
    ],
    "a request denied by one bucket costs the others nothing": [
        (0, TWO, Expect("allowed", ((True, 1, 0, S), (True, 0, 0, S)))),
        (0, TWO, Expect("limited", ((True, 0, 0, 2 * S), (False, 0, S, S)))),
        (S, TWO, Expect("allowed", ((True, 1, 0, S), (True, 0, 0, S)))),
    ],
    "repeating a prompt trips a block that ends on time": [
        (0, REP_ONLY, Expect("allowed")),
        (1, REP_ONLY, Expect("allowed")),
        (2, REP_ONLY, Expect("blocked", block_left=5 * S, newly=True)),
        (3 * S, REP_ONLY, Expect("blocked", block_left=2 * S + 2)),
        (5 * S + 1, REP_ONLY, Expect("blocked", block_left=1)),
        (5 * S + 2, REP_ONLY, Expect("allowed")),
        (5 * S + 3, REP_ONLY, Expect("allowed")),
    ],
    "the repeat window slides": [
        (0, REP_ONLY, Expect("allowed")),
        (600_000, REP_ONLY, Expect("allowed")),
        (S + 1, REP_ONLY, Expect("allowed")),
        (S + 100_000, REP_ONLY, Expect("blocked", block_left=5 * S, newly=True)),
    ],
    "a blocked request charges no bucket": [
        (0, REP_AND_BUCKET, Expect("allowed", ((True, 4, 0, S),))),
        (0, REP_AND_BUCKET, Expect("allowed", ((True, 3, 0, 2 * S),))),
        (0, REP_AND_BUCKET, Expect("blocked", block_left=5 * S, newly=True)),
        (0, REP_AND_BUCKET, Expect("blocked", block_left=5 * S)),
        (0, one(1, 5, key="t"), Expect("allowed", ((True, 2, 0, 3 * S),))),
    ],
}
