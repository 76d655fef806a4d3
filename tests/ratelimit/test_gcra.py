"""The pure cores: GCRA `take` and the repeated-prompt window."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.ratelimit.gcra import interval_us, note_arrival, take

from .cases import CASES, S

SINGLE = {
    name: steps
    for name, steps in CASES.items()
    if all(len(c.buckets) == 1 and c.repeat is None for _, c, _ in steps)
}


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_take_follows_the_table(name: str) -> None:
    state: int | None = None
    for now, check, expect in SINGLE[name]:
        b = check.buckets[0]
        d = take(state, now, b.rate, b.burst, b.cost)
        assert (d.allowed, d.remaining, d.retry_after, d.reset_after) == expect.buckets[0], (name, now)
        state = d.state if d.allowed else state


def test_a_denied_take_leaves_the_state_alone() -> None:
    full = take(None, 0, 1, 1)
    assert full.allowed and full.state == S
    denied = take(full.state, 0, 1, 1)
    assert not denied.allowed and denied.state is None


arrivals = st.lists(
    st.tuples(st.integers(0, 5 * S), st.integers(1, 3)), min_size=1, max_size=60
).map(sorted)


@settings(max_examples=300, deadline=None)
@given(arrivals, st.floats(0.2, 500), st.integers(1, 20))
def test_a_bucket_never_admits_more_than_rate_times_time_plus_burst(
    events: list[tuple[int, int]], rate: float, burst: int
) -> None:
    state: int | None = None
    admitted: list[tuple[int, int]] = []
    for now, cost in events:
        d = take(state, now, rate, burst, cost)
        if d.allowed:
            state = d.state
            admitted.append((now, cost))
    # Every window [admitted[i], admitted[j]], not just the ones starting at zero.
    for i, (start, _) in enumerate(admitted):
        total = 0
        for end, cost in admitted[i:]:
            total += cost
            assert total * interval_us(rate) <= (end - start) + burst * interval_us(rate)
            assert total <= rate * (end - start) / S + burst + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3 * S), max_size=40).map(sorted), st.integers(1, 12), st.integers(1, S))
def test_the_repeat_window_trips_exactly_on_one_arrival_too_many(
    times: list[int], limit: int, window: int
) -> None:
    history: tuple[int, ...] = ()
    kept: list[int] = []  # arrivals since the last trip, the model the window must match
    for now in times:
        noted = note_arrival(history, now, window, limit)
        in_window = [t for t in kept if t > now - window]
        assert noted.tripped == (len(in_window) >= limit)
        kept = [] if noted.tripped else [*in_window, now]
        history = noted.history
        assert list(history) == kept
        assert len(history) <= limit
