"""How long a request will wait for a slot, and how many slots to keep free for the top tier.

Pure functions of what the queue knows; no clock and no state.

Wait. A slot frees up every `service_s / limit` seconds on average while the pool is full
(Little's law on the slots), so the request that needs the `k`-th release from now waits
about `k * service_s / limit`. When the ages of the running requests are known the releases
are placed where they will fall: each running request ends `service_s` after it started, and
its slot then serves one request after another. A burst that filled every slot at once thus
waits for the first whole service time, and a waiting request's estimate shrinks while it
waits instead of staying put (it would otherwise be shed late, once what is left of its
deadline falls under an estimate that never moved). Higher classes that arrive meanwhile go
first: only the releases they leave count (never fewer than a tenth, so the estimate stays finite).
`service_s` is the time a slot was held, averaged over the last turn of the pool (its last
`limit` releases, at least `MIN_TURN`), so a pool that slowed down shows as soon as each slot
has served one slow request, not after an average has forgotten the fast ones; when the
requests holding slots now have been running longer than that, the median of their ages is
used instead: the estimate grows as soon as the slowdown shows, not after the slow
requests finish. Before anything was measured the estimate is unknown (None) and nobody is shed on it.

Reserve. Of `limit` slots, the top tier gets `ceil(factor * rate * service_s)` to itself
(its expected concurrency with headroom), at most `max_share` of the pool and never the last
slot. With no top-tier traffic the reserve is 0 and nothing is lost; under overload the other
tiers lose at most the reserved slots the top tier leaves idle.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MIN_TURN = 4


def service_time(recent: Sequence[float], held_ages: Sequence[float], limit: int = MIN_TURN) -> float | None:
    """Seconds a slot is held: the mean of the last turn of releases (`recent`, oldest first),
    or the running requests' median age if larger."""
    if not recent:
        return None  # ages alone say how long requests have run, not how long they take
    mean = statistics.fmean(recent[-max(limit, MIN_TURN):])
    running = statistics.median(held_ages) if held_ages else 0.0
    return max(mean, running)


def releases_needed(ahead: int, free: int) -> int:
    """Releases before a request with `ahead` better-ranked waiters and `free` open slots gets one."""
    return max(0, ahead + 1 - free)


def wait_estimate(
    ahead: int,
    free: int,
    limit: int,
    service_s: float | None,
    higher_arrivals_per_s: float = 0.0,
    held_ages: Sequence[float] = (),
) -> float | None:
    """Seconds until a slot; 0 when one is free for it now, None when it cannot be told."""
    k = releases_needed(ahead, free)
    if k == 0:
        return 0.0
    if service_s is None or limit <= 0:
        return None
    service_s = max(service_s, 1e-6)
    rate = limit / service_s
    left = max(0.1 * rate, rate - higher_arrivals_per_s)
    if not held_ages:
        return k / left
    return release_time(k * rate / left, held_ages, service_s)


def release_time(n: float, held_ages: Sequence[float], service_s: float) -> float:
    """Seconds until the `n`-th release from now (rounded up) of slots whose requests have run
    `held_ages`: each ends `service_s` after it started, then its slot turns over every
    `service_s`. One already running longer than that is half-way (it may run as long again)."""
    ends = sorted(service_s - age if age < service_s else age / 2 for age in held_ages)
    index = max(0, math.ceil(n - 1e-9) - 1)
    turns, slot = divmod(index, len(ends))
    return ends[slot] + turns * service_s


def reserve_slots(
    limit: int, rate_per_s: float, service_s: float | None, factor: float, max_share: float
) -> int:
    """Slots kept for the top tier: its expected concurrency times `factor`, bounded."""
    if limit <= 1 or factor <= 0 or max_share <= 0 or service_s is None or rate_per_s <= 0:
        return 0
    wanted = math.ceil(factor * rate_per_s * service_s - 1e-9)
    return max(0, min(wanted, math.floor(limit * max_share), limit - 1))
