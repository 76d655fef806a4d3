"""`llm-gate dedup status`: every bin with its counts, bound and state; config validation."""

from __future__ import annotations

import pytest

from extproc.cache.bins import MemoryBins
from extproc.cache.selfcheck_admin import main, render, status
from extproc.config import ConfigError, parse_config


async def test_status_lists_every_bin_serving_or_learning_against_the_configured_target() -> None:
    bins = MemoryBins()
    for i in range(40):
        await bins.record("acme", "en", "0.90", True, f"a{i}")
        await bins.record("acme", "en", "0.80", i % 4 > 0, f"b{i}")
    config = parse_config("cache: {semantic: {self_check: {enabled: true, target: 0.9, min_checks: 30}}}")
    rows = await status(bins, config)
    assert [(r["bin"], r["checks"], r["agreed"], r["state"]) for r in rows] == [
        ("0.80", 40, 30, "learning"),
        ("0.90", 40, 40, "serving"),  # 40 of 40: lower bound 0.912
    ]
    text = render(rows, 0.9)
    assert "0.90      40      40      1.000   0.912  serving" in text
    assert "target 0.9" in text


def test_status_without_redis_says_where_the_counts_are(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 1
    assert "gate_cache_selfcheck_" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("{bins: [0.8, 0.6]}", "bins must rise"),
        ("{bins: [0.5, 1.0]}", "bins are verifier scores in [0, 1)"),
        ("{share: 1.5}", "less than or equal to 1"),
        ("{target: 1.0}", "less than 1"),
        ("{min_checks: 0}", "greater than or equal to 1"),
    ],
)
def test_self_check_settings_are_validated(section: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"cache: {{semantic: {{self_check: {section}}}}}")
    assert problem in str(err.value) and "cache.semantic.self_check" in str(err.value)
