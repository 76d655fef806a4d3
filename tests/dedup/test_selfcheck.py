"""Self-calibration decisions: bins, when a bin serves, when a candidate is checked, agreement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.dedup.selfcheck import (
    Counts,
    action,
    agree,
    bin_of,
    normalise_answer,
    prior,
    same_text,
    verdict,
    wilson_lower,
)

EDGES = (0.6, 0.8, 0.9)


@pytest.mark.parametrize(
    ("score", "name"),
    [(0.59, None), (0.6, "0.60"), (0.79, "0.60"), (0.8, "0.80"), (0.899, "0.80"), (0.9, "0.90"),
     (1.0, "0.90")],
)
def test_a_score_falls_in_the_bin_of_the_highest_edge_it_reaches(score: float, name: str | None) -> None:
    assert bin_of(score, EDGES) == name


@pytest.mark.parametrize(
    ("checks", "agreed", "target", "min_checks", "expected"),
    [
        (0, 0, 0.95, 30, "learn"),  # no evidence: learn
        (72, 72, 0.95, 30, "learn"),  # 72 of 72 is not yet a 0.95 lower bound
        (73, 73, 0.95, 30, "serve"),
        (100, 95, 0.95, 30, "learn"),  # 95% measured is not 95% proven
        (20, 20, 0.8, 30, "learn"),  # bound reached (0.839) but too few checks
        (30, 30, 0.8, 30, "serve"),
        (74, 73, 0.95, 30, "learn"),  # one wrong answer among 74: the bin stops at once
    ],
)
def test_a_bin_serves_only_on_enough_checks_with_its_lower_bound_at_the_target(
    checks: int, agreed: int, target: float, min_checks: int, expected: str
) -> None:
    assert verdict(Counts(checks, agreed), target, min_checks) == expected


@pytest.mark.parametrize(
    ("v", "share", "draw", "expected"),
    [
        ("learn", 0.0, 0.99, "check"),  # a learning bin checks every candidate
        ("serve", 0.03, 0.02, "check"),
        ("serve", 0.03, 0.03, "serve"),
        ("serve", 0.0, 0.0, "serve"),
        ("serve", 1.0, 0.999, "check"),
    ],
)
def test_a_serving_bin_checks_its_share_of_candidates(
    v: str, share: float, draw: float, expected: str
) -> None:
    assert action(v, share, draw) == expected  # type: ignore[arg-type]


@given(st.integers(0, 500), st.integers(0, 500))
def test_the_lower_bound_never_exceeds_the_measured_precision(a: int, b: int) -> None:
    n, ok = max(a, b), min(a, b)
    c = Counts(n, ok)
    assert 0.0 <= c.lower <= c.precision + 1e-12
    assert c.lower == wilson_lower(ok, n)


@given(st.integers(1, 300), st.integers(0, 300))
def test_a_wrong_answer_never_raises_the_bound(n: int, ok: int) -> None:
    ok = min(ok, n)
    assert wilson_lower(ok, n + 1) <= wilson_lower(ok, n) + 1e-12


def test_answers_that_differ_only_in_case_spacing_and_punctuation_are_the_same() -> None:
    assert same_text("Paris is the capital.", "  paris IS the capital ")
    assert normalise_answer("Ｐａｒｉｓ!") == "paris"
    assert not same_text("Paris is the capital.", "Lyon is the capital.")


def test_answers_agree_by_embedding_only_at_the_threshold() -> None:
    assert agree(0.97, 0.97) and not agree(0.969, 0.97)
    assert not agree(None, 0.5)  # an answer the embedder cannot read is no agreement


# (threshold, pairs scored at or above it, of them the same question): a selection curve.
EVIDENCE = [(0.5, 400, 300), (0.6, 300, 250), (0.8, 200, 190), (0.85, 150, 148), (0.9, 100, 100)]


def test_only_bins_whose_shipped_pairs_prove_the_target_get_a_prior_just_enough_to_serve() -> None:
    bins = prior(EVIDENCE, EDGES, target=0.95, min_checks=30)
    # 0.60: 60 of 100 and 0.80: 90 of 100 prove nothing; 0.90: 100 of 100 (bound 0.963).
    assert bins == {"0.90": Counts(73, 73)}  # the fewest checks whose bound reaches 0.95
    assert verdict(bins["0.90"], 0.95, 30) == "serve"
    assert verdict(bins["0.90"] + Counts(1, 0), 0.95, 30) == "learn"  # one live wrong answer stops it
    assert verdict(bins["0.90"] + Counts(40, 40) + Counts(1, 0), 0.95, 30) == "serve"  # ... until it has more


def test_a_prior_keeps_its_wrong_pairs_rounded_up_and_min_checks() -> None:
    bins = prior(EVIDENCE, EDGES, target=0.8, min_checks=30)
    # 0.80: 90 of 100, bound 0.826: the fewest checks at 10% wrong (rounded up) that prove 0.8.
    start = bins["0.80"]
    assert start.checks < 100 and start.checks - start.agreed >= 0.1 * start.checks
    assert verdict(start, 0.8, 30) == "serve"
    assert verdict(Counts(start.checks - 1, start.agreed - 1), 0.8, 30) == "learn"
    assert prior([(0.9, 20, 20)], (0.9,), target=0.5, min_checks=30) == {}  # fewer pairs than min_checks


def test_no_prior_for_a_bin_the_curve_does_not_reach() -> None:
    edges = (0.6, 0.7, 0.9)  # 0.7 is no threshold of the curve
    assert prior(EVIDENCE, edges, target=0.95, min_checks=30).keys() == {"0.90"}
    assert prior([], EDGES, target=0.5, min_checks=1) == {}
