"""The adaptive limit: slower with less throughput shrinks capacity; healthy grows it back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from extproc.breaker.adaptive import AdaptiveLimit, Level, step
from extproc.breaker.monitor import PoolHealth
from extproc.breaker.state import Phase
from extproc.config import Breaker

CONFIG = Breaker(min_samples=10, close_p95_s=1.8)


def health(
    p95: float | None, rps: float, at: float, phase: Phase = Phase.CLOSED, samples: int = 100
) -> PoolHealth:
    return PoolHealth("primary", phase, p95, 0.0, rps, samples, at)


def test_slower_and_fewer_completions_shrink_then_recovery_grows_back() -> None:
    calls: list[tuple[str, float]] = []
    limit = AdaptiveLimit(CONFIG, lambda pool, f: calls.append((pool, f)))
    limit(health(0.8, 20.0, 0))  # healthy at full capacity: nothing to change
    assert calls == []
    for t in range(1, 4):
        limit(health(2.2, 12.0, t))  # P95 climbed, throughput dropped
    assert [round(f, 3) for _, f in calls] == [0.8, 0.64, 0.512]
    for t in range(4, 20):
        limit(health(0.9, 15.0, t))
    assert calls[-1] == ("primary", 1.0)


def test_slow_but_throughput_holding_is_not_the_knee() -> None:
    level = step(Level(), health(0.5, 20.0, 0), CONFIG)
    level = step(level, health(2.2, 19.5, 1), CONFIG)
    assert level.factor == 1.0


def test_too_few_samples_or_an_open_breaker_do_not_shrink() -> None:
    level = step(Level(peak=50, at=0), health(3.0, 1.0, 1, samples=5), CONFIG)
    assert level.factor == 1.0
    level = step(Level(factor=0.5, peak=50, at=0), health(3.0, 1.0, 1, phase=Phase.OPEN), CONFIG)
    assert level.factor == 0.5


@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0.01, 20)), st.floats(0, 100), st.integers(0, 50))))
def test_the_factor_stays_between_the_floor_and_one(seq: list[tuple[float | None, float, int]]) -> None:
    level, at = Level(), 0.0
    for p95, rps, samples in seq:
        at += 0.5
        level = step(level, health(p95, rps, at, samples=samples), CONFIG)
        assert CONFIG.adaptive.floor <= level.factor <= 1.0
