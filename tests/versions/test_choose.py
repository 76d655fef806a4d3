"""The version choice: weighted, sticky per caller, canary first, a pure function."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.versions.choose import Share, caller_key, choose_version, point, shares
from extproc.versions.settings import ModelVersion, VersionedModel

CHAT = VersionedModel(
    versions=[
        ModelVersion(name="v1", pool="chat-v1", weight=100),
        ModelVersion(name="v2", pool="chat-v2", canary=True),
    ]
)


def test_10000_requests_from_1000_callers_at_15_percent() -> None:
    table = shares(CHAT, canary_weight=15)
    seen: dict[str, set[str]] = {}
    counts: Counter[str] = Counter()
    for i in range(10_000):
        user = f"user-{i % 1000}"
        version = choose_version(table, caller_key("acme", user, "chat")).name
        counts[version] += 1
        seen.setdefault(user, set()).add(version)
    assert len(seen) == 1000
    assert all(len(versions) == 1 for versions in seen.values())  # every caller saw one version
    assert abs(counts["v2"] / 10_000 - 0.15) <= 0.015


def test_caller_sets_spread_as_independent_draws() -> None:
    """Sticky per caller means 1,000 callers are 1,000 draws: σ = √(0.15 · 0.85 / 1000) ≈ 1.1%.
    Over 200 different sets of 1,000 callers the mean is 15% and the spread that σ."""
    table = shares(CHAT, canary_weight=15)
    measured = [
        sum(choose_version(table, caller_key(f"t{s}", f"u{i}", "chat")).canary for i in range(1000)) / 1000
        for s in range(200)
    ]
    mean = sum(measured) / len(measured)
    sd = (sum((m - mean) ** 2 for m in measured) / len(measured)) ** 0.5
    assert abs(mean - 0.15) <= 0.003
    assert 0.008 <= sd <= 0.014


@pytest.mark.parametrize("weight", [0, 1, 5, 15, 25, 50, 75, 100])
def test_share_of_many_callers_matches_the_weight(weight: float) -> None:
    table = shares(CHAT, canary_weight=weight)
    n = 20_000
    canary = sum(choose_version(table, caller_key("t", f"u{i}", "chat")).canary for i in range(n))
    assert abs(canary / n - weight / 100) <= 0.015


@given(st.text(max_size=30), st.floats(0, 100), st.floats(0, 100))
def test_raising_the_canary_never_moves_a_canary_caller_back(user: str, low: float, high: float) -> None:
    low, high = min(low, high), max(low, high)
    key = caller_key("acme", user, "chat")
    if choose_version(shares(CHAT, canary_weight=low), key).canary:
        assert choose_version(shares(CHAT, canary_weight=high), key).canary


@given(st.text(max_size=40))
def test_point_is_stable_and_in_the_unit_interval(key: str) -> None:
    assert 0 <= point(key) < 1 and point(key) == point(key)


def test_configured_weights_are_relative_and_overrides_replace_them() -> None:
    three = VersionedModel(
        versions=[
            ModelVersion(name="a", pool="p1", weight=3),
            ModelVersion(name="b", pool="p2", weight=1),
            ModelVersion(name="c", pool="p3", weight=1, canary=True),
        ]
    )
    assert [(s.name, round(s.share, 3)) for s in shares(three)] == [("c", 0.2), ("a", 0.6), ("b", 0.2)]
    assert [round(s.share, 3) for s in shares(three, canary_weight=50)] == [0.5, 0.375, 0.125]
    assert [round(s.share, 3) for s in shares(three, stable="b", canary_weight=10)] == [0.1, 0.0, 0.9]
    assert [round(s.share, 3) for s in shares(three, stable="c")] == [1.0, 0.0, 0.0]  # canary as stable


def test_zero_shares_are_never_chosen() -> None:
    table = (Share("v2", "p2", 0.0, canary=True), Share("v1", "p1", 1.0))
    assert {choose_version(table, str(i)).name for i in range(500)} == {"v1"}
    with pytest.raises(ValueError):
        choose_version((Share("x", "p", 0.0),), "k")


@pytest.mark.parametrize(
    "versions",
    [
        [{"name": "a", "pool": "p"}, {"name": "a", "pool": "q", "weight": 1}],  # same name twice
        [{"name": "a", "pool": "p", "canary": True}, {"name": "b", "pool": "q", "canary": True}],
        [{"name": "a", "pool": "p"}],  # nobody has a weight
    ],
)
def test_bad_version_lists_are_refused(versions: list[dict[str, object]]) -> None:
    with pytest.raises(ValueError):
        VersionedModel.model_validate({"versions": versions})
