"""The step decision: a table of cases for the pure `next_rollout`."""

from __future__ import annotations

import pytest

from extproc.breaker.window import Stats
from extproc.versions.rollout import RolloutState, begin, next_rollout, worse
from extproc.versions.settings import Rollout

CFG = Rollout(steps=[5, 25, 50, 100], hold_s=60, min_samples=20, max_p95_ratio=1.5, p95_slack_s=0.05,
              max_error_rate_increase=0.05)
STABLE = Stats(samples=500, errors=5, p95_s=0.4, window_s=60)  # 1% errors
FINE = Stats(samples=40, errors=0, p95_s=0.45, window_s=60)
T0 = 1_000.0


def at(step: int, since: float = T0) -> RolloutState:
    return RolloutState("v2", "rolling", CFG.steps[step], step, since, 7)


@pytest.mark.parametrize(
    ("state", "canary", "now", "phase", "weight"),
    [
        (at(0), FINE, T0 + 10, "rolling", 5),  # held: not yet 60 s
        (at(0), FINE, T0 + 60, "rolling", 25),  # held long enough and fine: next step
        (at(2), FINE, T0 + 61, "done", 100),  # the last step ends the rollout
        (at(1), Stats(10, 0, 0.4, 60), T0 + 120, "rolling", 25),  # too few calls to step on
        (at(1), Stats(10, 9, 0.4, 60), T0 + 1, "rolling", 25),  # nor to judge
        (at(1), Stats(40, 4, 0.4, 60), T0 + 1, "rolled_back", 0),  # 10% errors vs 1% + 5%
        (at(1), Stats(40, 2, 0.4, 60), T0 + 1, "rolling", 25),  # 5% errors: within the margin
        (at(1), Stats(40, 0, 1.2, 60), T0 + 1, "rolled_back", 0),  # 3x slower: P95 1.2 s > 0.65 s
        (at(1), Stats(40, 0, 0.64, 60), T0 + 1, "rolling", 25),  # just within 1.5 x 0.4 + 0.05
        (RolloutState("v2", "rolled_back", 0, 1, T0, 8), FINE, T0 + 99,
         "rolled_back", 0),  # a rolled-back canary stays at 0
        (RolloutState("v2", "manual", 30, 0, T0, 8), FINE, T0 + 999, "manual", 30),  # nothing steps it
    ],
)
def test_next_rollout(state: RolloutState, canary: Stats, now: float, phase: str, weight: float) -> None:
    new = next_rollout(state, canary, STABLE, now, CFG)
    assert (new.phase, new.weight) == (phase, weight)
    if new is not state:
        assert new.version == state.version + 1 and new.since == now


def test_a_slow_stable_version_is_no_excuse_and_no_stable_calls_mean_no_p95_verdict() -> None:
    slow_stable = Stats(samples=500, errors=0, p95_s=2.0, window_s=60)
    assert worse(Stats(40, 0, 2.5, 60), slow_stable, CFG) is None  # the same slowness: not worse
    assert worse(Stats(40, 0, 9.0, 60), Stats(), CFG) is None  # nothing to compare with
    assert "error rate" in (worse(Stats(40, 10, 0.1, 60), Stats(), CFG) or "")


def test_begin_starts_at_the_first_step() -> None:
    state = begin("v2", CFG, T0, version=3)
    assert (state.phase, state.weight, state.step, state.since, state.version) == ("rolling", 5, 0, T0, 3)


def test_steps_must_rise_within_0_and_100() -> None:
    for steps in ([5, 5], [50, 25], [0, 10], [10, 150]):
        with pytest.raises(ValueError):
            Rollout(steps=steps)
