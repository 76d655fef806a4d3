from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.breaker.window import BUCKETS, GROWTH, Slice, Window, bound, bucket_of, quantile, summarize

latencies = st.floats(min_value=0.0005, max_value=1000, allow_nan=False)


@given(latencies)
def test_a_latency_falls_in_a_bucket_at_most_one_step_wide(x: float) -> None:
    i = bucket_of(x)
    assert 0 <= i < BUCKETS
    assert bound(i) >= x * (1 - 1e-9)
    if i > 0:
        assert bound(i - 1) < x * GROWTH


@pytest.mark.parametrize(
    ("samples", "p95"),
    [([0.1] * 100, 0.1), ([0.1] * 95 + [3.0] * 5, 0.1), ([0.1] * 94 + [3.0] * 6, 3.0), ([2.0], 2.0)],
)
def test_p95_of_known_samples_within_one_bucket(samples: list[float], p95: float) -> None:
    part = Slice()
    for s in samples:
        part.add(s, error=False)
    got = quantile(part.buckets, 0.95)
    assert got is not None and p95 <= got < p95 * GROWTH * 1.0001


def test_no_samples_no_p95_and_errors_do_not_enter_the_latency_histogram() -> None:
    part = Slice()
    part.add(None, error=True)
    part.add(9.0, error=True)
    stats = summarize([part], 10)
    assert stats.p95_s is None and stats.samples == 2 and stats.error_rate == 1.0


@given(st.lists(st.tuples(latencies, st.booleans(), st.integers(0, 3))))
def test_merging_per_process_slices_equals_one_histogram_of_everything(
    samples: list[tuple[float, bool, int]],
) -> None:
    everything, parts = Slice(), [Slice() for _ in range(4)]
    for latency, error, process in samples:
        everything.add(latency, error)
        parts[process].add(latency, error)
    assert summarize(parts, 60) == summarize([everything], 60)


def test_samples_age_out_of_the_window() -> None:
    w = Window(window_s=10, slices=10)
    for t in range(5):
        w.add(100.0 + t, 3.0, error=False)
    assert w.stats(105.0, since=0).samples == 5
    assert w.stats(112.0, since=0).samples == 2  # slices 103 and 104 are still in (103..112)
    assert w.stats(120.0, since=0).samples == 0
    assert not w.slices


def test_stats_since_a_transition_leave_out_older_slices() -> None:
    w = Window(window_s=60, slices=60)
    for t in range(10):
        w.add(1000.0 + t, 5.0, error=False)
    w.add(1011.5, 0.2, error=False)
    stats = w.stats(1012.0, since=1011.2)
    assert stats.samples == 1 and stats.p95_s is not None and stats.p95_s < 0.25


def test_pending_deltas_are_handed_out_once_and_restored_on_failure() -> None:
    w = Window(window_s=10, slices=10)
    w.add(100.0, 1.0, error=False)
    taken = w.take_pending()
    assert sum(p.samples for p in taken.values()) == 1 and not w.pending
    w.add(100.5, None, error=True)
    w.restore_pending(taken, 101.0)
    assert sum(p.samples for p in w.pending.values()) == 2
    w.restore_pending(w.take_pending(), 200.0)  # long gone: dropped, not re-sent
    assert not w.pending
