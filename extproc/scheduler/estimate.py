"""How long a request will wait for a slot, and how many slots to keep free for the top tier.

Pure functions of what the queue knows; no clock and no state.

Wait. A slot frees up every `service_s / limit` seconds on average while the pool is full
(Little's law on the slots), so the request that needs the `k`-th release from now waits
about `k * service_s / limit`. Higher classes that arrive meanwhile go first: only the
releases they leave count (never fewer than a tenth, so the estimate stays finite).
`service_s` is the time a slot was held, averaged over recent releases with the newest
weighing most (`SERVICE_WEIGHT` each), so a pool that slowed down shows in a few releases;
when the requests holding slots now have been running longer than that, the median of their
ages is used instead: the estimate grows as soon as the slowdown shows, not after the slow
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

SERVICE_WEIGHT = 0.25


def service_time(recent: Sequence[float], held_ages: Sequence[float]) -> float | None:
    """Seconds a slot is held: recent releases (oldest first, the newest weighing most), or the
    running requests' median age if larger."""
    if not recent:
        return None  # ages alone say how long requests have run, not how long they take
    mean = recent[0]
    for x in recent[1:]:
        mean += SERVICE_WEIGHT * (x - mean)
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
) -> float | None:
    """Seconds until a slot; 0 when one is free for it now, None when it cannot be told."""
    k = releases_needed(ahead, free)
    if k == 0:
        return 0.0
    if service_s is None or limit <= 0:
        return None
    rate = limit / max(service_s, 1e-6)
    left = max(0.1 * rate, rate - higher_arrivals_per_s)
    return k / left


def reserve_slots(
    limit: int, rate_per_s: float, service_s: float | None, factor: float, max_share: float
) -> int:
    """Slots kept for the top tier: its expected concurrency times `factor`, bounded."""
    if limit <= 1 or factor <= 0 or max_share <= 0 or service_s is None or rate_per_s <= 0:
        return 0
    wanted = math.ceil(factor * rate_per_s * service_s - 1e-9)
    return max(0, min(wanted, math.floor(limit * max_share), limit - 1))
