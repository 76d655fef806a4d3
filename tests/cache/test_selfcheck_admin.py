"""`llm-gate dedup status`: every bin with its counts, bound and state; config validation."""

from __future__ import annotations

import pytest

from extproc.cache.bins import MemoryBins
from extproc.cache.selfcheck_admin import main, render, status
from extproc.config import ConfigError, parse_config
from extproc.dedup.selfcheck import Counts


async def test_status_lists_every_bin_serving_or_learning_against_the_configured_target() -> None:
    bins = MemoryBins()
    for i in range(40):
        await bins.record("acme", "en", "0.90", True, f"a{i}")
        await bins.record("acme", "en", "0.80", i % 4 > 0, f"b{i}")
    config = parse_config(
        "cache: {semantic: {self_check: {enabled: true, target: 0.9, min_checks: 30, prior: false}}}"
    )
    rows = await status(bins, config)
    assert [(r["bin"], r["checks"], r["agreed"], r["state"]) for r in rows] == [
        ("0.80", 40, 30, "learning"),
        ("0.90", 40, 40, "serving"),  # 40 of 40: lower bound 0.912
    ]
    text = render(rows, 0.9)
    assert "0.90      40      40       0/0      1.000   0.912  serving" in text
    assert "target 0.9" in text


async def test_status_shows_the_prior_every_tenant_starts_from_and_counts_it_in() -> None:
    """At target 0.85 the shipped English curve of the default embedder proves its top bin."""
    bins = MemoryBins()
    for i in range(10):
        await bins.record("acme", "en", "0.90", True, f"a{i}")
    config = parse_config("cache: {semantic: {self_check: {enabled: true, target: 0.85}}}")
    rows = await status(bins, config)
    start = {r["bin"]: r for r in rows if r["tenant"] == "*"}
    assert set(start) == {"0.90"} and start["0.90"]["state"] == "serving"
    assert start["0.90"]["checks"] == 0 and start["0.90"]["prior_checks"] >= 30
    (acme,) = [r for r in rows if r["tenant"] == "acme"]
    assert (acme["checks"], acme["prior_checks"]) == (10, start["0.90"]["prior_checks"])
    both = Counts(10 + acme["prior_checks"], 10 + acme["prior_agreed"])
    assert acme["lower_bound"] == round(both.lower, 4) > start["0.90"]["lower_bound"]
    strict = parse_config("cache: {semantic: {self_check: {enabled: true}}}")  # 0.95: proves no bin
    assert [r for r in await status(MemoryBins(), strict)] == []


def test_status_without_redis_says_where_the_counts_are(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 1
    assert "gate_cache_selfcheck_" in capsys.readouterr().err


def test_status_with_redis_unreachable_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--redis", "redis://127.0.0.1:1/0"]) == 1
    assert "cannot read the bins from Redis" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("{bins: [0.8, 0.6]}", "bins must rise"),
        ("{bins: [0.5, 1.0]}", "bins are verifier scores in [0, 1)"),
        ("{share: 1.5}", "less than or equal to 1"),
        ("{target: 1.0}", "less than 1"),
        ("{min_checks: 0}", "greater than or equal to 1"),
        ("{warm_share: -0.1}", "greater than or equal to 0"),
    ],
)
def test_self_check_settings_are_validated(section: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"cache: {{semantic: {{self_check: {section}}}}}")
    assert problem in str(err.value) and "cache.semantic.self_check" in str(err.value)
