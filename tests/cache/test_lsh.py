"""LSH parameters and buckets: the probability model, and that buckets behave like it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.cache.lsh import Lsh, choose, collision


@given(st.floats(-1, 1), st.floats(-1, 1), st.integers(1, 16), st.integers(1, 32))
def test_collision_grows_with_cosine(a: float, b: float, rows: int, bands: int) -> None:
    lo, hi = sorted((a, b))
    assert collision(lo, rows, bands) <= collision(hi, rows, bands) + 1e-12


@pytest.mark.parametrize("floor", [0.7, 0.8, 0.85, 0.9, 0.95])
def test_chosen_parameters_reach_the_target_and_are_the_most_selective(floor: float) -> None:
    rows, bands = choose(floor, target=0.995, max_bands=32)
    assert collision(floor, rows, bands) >= 0.995
    assert all(collision(floor, rows + 1, b) < 0.995 for b in range(1, 33))


def unit(v: np.ndarray) -> np.ndarray:
    out: np.ndarray = (v / np.linalg.norm(v)).astype(np.float32)
    return out


def test_same_seed_same_buckets_other_embedder_other_buckets() -> None:
    v = unit(np.random.default_rng(1).standard_normal(64))
    a = Lsh.create(64, 8, 4, seed=7, name="minilm")
    assert a.band_keys(v) == Lsh.create(64, 8, 4, seed=7, name="minilm").band_keys(v)
    assert not set(a.band_keys(v)) & set(Lsh.create(64, 8, 4, seed=7, name="e5-small").band_keys(v))


def test_measured_candidate_rate_follows_the_model() -> None:
    """Pairs at a known cosine share a bucket about as often as `collision` says."""
    rng = np.random.default_rng(0)
    dim, rows, bands, cos = 128, 6, 8, 0.9
    lsh = Lsh.create(dim, rows, bands, seed=3)
    hits = 0
    for _ in range(400):
        a = unit(rng.standard_normal(dim))
        noise = unit(rng.standard_normal(dim) - a * (a @ rng.standard_normal(dim)))
        noise = unit(noise - a * float(a @ noise))
        b = unit(cos * a + np.sqrt(1 - cos**2) * noise)
        hits += bool(set(lsh.band_keys(a)) & set(lsh.band_keys(b)))
    assert abs(hits / 400 - collision(cos, rows, bands)) < 0.06
