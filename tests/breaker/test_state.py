"""Every transition of the breaker, the minimum-sample rule, and no flapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.breaker.state import BreakerState, Evaluate, Phase, next_state, use_primary
from extproc.breaker.window import Stats
from extproc.config import Breaker

LIMITS = Breaker(
    min_samples=10,
    probe_min_samples=3,
    open_p95_s=2.5,
    close_p95_s=1.8,
    max_error_rate=0.2,
    hold_s=30,
    recovery_s=300,
    probe_share=0.01,
    probe_interval_s=5,
)
C, O, H = Phase.CLOSED, Phase.OPEN, Phase.HALF_OPEN  # noqa: E741 - the state diagram


def stats(samples: int, p95: float | None, errors: int = 0) -> Stats:
    return Stats(samples=samples, errors=errors, p95_s=p95, window_s=60)


# (case, phase, entered, healthy_since, stats, now, expected phase, expected healthy_since)
CASES = [
    ("closed stays when fast", C, 0, None, stats(100, 0.5), 100, C, None),
    ("closed opens when p95 over bound", C, 0, None, stats(100, 3.0), 100, O, None),
    ("closed opens on error rate", C, 0, None, stats(100, 0.5, errors=21), 100, O, None),
    ("closed: error rate at the bound is not over it", C, 0, None, stats(100, 0.5, errors=20), 100, C, None),
    ("closed: p95 at the bound is not over it", C, 0, None, stats(100, 2.5), 100, C, None),
    ("min samples: slow but too few", C, 0, None, stats(9, 30.0), 100, C, None),
    ("min samples: all errors but too few", C, 0, None, stats(9, None, errors=9), 100, C, None),
    ("min samples: exactly enough", C, 0, None, stats(10, 3.0), 100, O, None),
    ("closed holds hold_s after entering", C, 90, None, stats(100, 9.0), 100, C, None),
    ("open holds hold_s", O, 80, None, stats(0, None), 100, O, None),
    ("open → half-open after hold_s", O, 70, None, stats(0, None), 100, H, None),
    ("half-open: too few probes, no change", H, 0, None, stats(2, 9.0), 100, H, None),
    ("half-open: slow probes reopen", H, 90, None, stats(3, 3.0), 100, O, None),
    ("half-open: failing probes reopen", H, 90, None, stats(5, 0.2, errors=2), 100, O, None),
    ("half-open: fast probes start the recovery clock", H, 0, None, stats(5, 1.0), 100, H, 100),
    ("half-open: recovery clock keeps running", H, 0, 100, stats(5, 1.0), 399, H, 100),
    ("half-open: closes after recovery_s", H, 0, 100, stats(5, 1.0), 400, C, None),
    ("half-open: between bounds resets the clock", H, 0, 100, stats(5, 2.0), 399, H, None),
]


@pytest.mark.parametrize(
    ("case", "phase", "entered", "healthy", "window", "now", "phase_after", "healthy_after"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_transition_table(
    case: str,
    phase: Phase,
    entered: float,
    healthy: float | None,
    window: Stats,
    now: float,
    phase_after: Phase,
    healthy_after: float | None,
) -> None:
    state = BreakerState(phase, entered, 7, "x", healthy)
    new = next_state(state, Evaluate(window), now, LIMITS)
    assert new.phase is phase_after
    assert new.healthy_since == healthy_after
    if phase_after is phase:
        assert (new.version, new.since) == (7, entered)
    else:
        assert (new.version, new.since) == (8, now)
        assert new.reason


def test_a_full_cycle_under_the_seed_timings() -> None:
    slow, fast = Evaluate(stats(50, 4.0)), Evaluate(stats(50, 0.4))
    s = BreakerState(C, 0, 0)
    s = next_state(s, slow, 60, LIMITS)
    assert s.phase is O
    s = next_state(s, fast, 89, LIMITS)
    assert s.phase is O
    s = next_state(s, fast, 90, LIMITS)
    assert s.phase is H
    for t in range(91, 390, 10):
        s = next_state(s, fast, t, LIMITS)
        assert s.phase is H
    s = next_state(s, fast, 391, LIMITS)
    assert s.phase is C and s.version == 3


@pytest.mark.parametrize(
    ("phase", "draw", "last_probe", "now", "primary"),
    [
        (C, 0.999, 0, 100, True),
        (O, 0.0, 0, 100, False),
        (H, 0.005, 99.9, 100, True),  # inside the 1% share
        (H, 0.5, 99, 100, False),  # outside it, and probed a second ago
        (H, 0.5, 94, 100, True),  # no probe for probe_interval_s
        (H, 0.5, 10, 60, True),  # the first request after entering HALF_OPEN probes
    ],
)
def test_routing_choice(phase: Phase, draw: float, last_probe: float, now: float, primary: bool) -> None:
    state = BreakerState(phase, 50, 1)
    assert use_primary(state, draw, now, last_probe, LIMITS) is primary


events = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=20.0),  # time step
        st.integers(min_value=0, max_value=60),  # samples
        st.one_of(st.none(), st.floats(min_value=0.01, max_value=10.0)),  # p95
        st.integers(min_value=0, max_value=60),  # errors
    ),
    max_size=200,
)


@settings(max_examples=300)
@given(events)
def test_no_flapping_the_bulk_route_never_changes_faster_than_hold_s(
    seq: list[tuple[float, int, float | None, int]],
) -> None:
    """Whatever the windows say, CLOSED and OPEN are each held at least hold_s, and the
    breaker only ever moves along the arrows of the state diagram."""
    allowed = {(C, O), (O, H), (H, O), (H, C)}
    state, now = BreakerState(C, 0, 0), 0.0
    for step, samples, p95, errors in seq:
        now += step
        window = stats(samples, p95, errors=min(errors, samples))
        new = next_state(state, Evaluate(window), now, LIMITS)
        if new.version != state.version:
            assert (state.phase, new.phase) in allowed
            assert new.version == state.version + 1 and new.since == now
            if state.phase in (C, O):
                assert now - state.since >= LIMITS.hold_s
            if state.phase is H and new.phase is C:
                assert now - state.since >= LIMITS.recovery_s
        state = new


@given(st.integers(min_value=0, max_value=9), st.floats(min_value=0.01, max_value=100), st.integers(0, 9))
def test_below_min_samples_closed_never_opens(samples: int, p95: float, errors: int) -> None:
    state = BreakerState(C, 0, 0)
    new = next_state(state, Evaluate(stats(samples, p95, min(errors, samples))), 1000, LIMITS)
    assert new is state
