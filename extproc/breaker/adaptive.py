"""The adaptive limit: shrink a pool's admission capacity when it slows down under load.

Before the breaker opens, a pool that gets slower while completing fewer calls is past
its knee: admitting more only lengthens every answer. `step` is the pure policy (AIMD on
a capacity factor); `AdaptiveLimit` subscribes to the breaker's per-tick `PoolHealth` and
hands the factor to admission, e.g. in `build_pipeline`:

    breakers.subscribe(AdaptiveLimit(config.breaker, admission.set_capacity_factor))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..config import Breaker as BreakerConfig
from .monitor import PoolHealth
from .state import Phase


@dataclass(frozen=True)
class Level:
    factor: float = 1.0  # share of measured capacity admission may use
    peak: float = 0.0  # recent peak throughput (calls/s), decaying
    at: float | None = None


def step(level: Level, health: PoolHealth, config: BreakerConfig) -> Level:
    a = config.adaptive
    dt = 0.0 if level.at is None else max(0.0, health.at - level.at)
    peak = max(health.throughput, level.peak * math.pow(0.5, dt / a.peak_half_life_s))
    factor = level.factor
    if health.phase is Phase.CLOSED and health.samples >= config.min_samples and health.p95_s is not None:
        if health.p95_s > config.close_p95_s and health.throughput < a.drop * peak:
            factor = max(a.floor, factor * a.decrease)
        elif health.p95_s <= config.close_p95_s:
            factor = min(1.0, factor + a.increase)
    elif health.phase is Phase.CLOSED:
        factor = min(1.0, factor + a.increase)
    return Level(factor, peak, health.at)


class AdaptiveLimit:
    """A breaker subscriber: calls `set_factor(pool, factor)` whenever a pool's factor changes."""

    def __init__(self, config: BreakerConfig, set_factor: Callable[[str, float], None]) -> None:
        self.config = config
        self.set_factor = set_factor
        self.levels: dict[str, Level] = {}

    def __call__(self, health: PoolHealth) -> None:
        if not self.config.adaptive.enabled:
            return
        old = self.levels.get(health.pool, Level())
        new = self.levels[health.pool] = step(old, health, self.config)
        if new.factor != old.factor:
            self.set_factor(health.pool, new.factor)
