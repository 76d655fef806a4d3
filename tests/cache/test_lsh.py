"""LSH parameters and buckets: the probability model, and that buckets behave like it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.cache.lsh import Lsh, choose, collision
from extproc.cache.store import MemoryStore, Put

from .helpers import matcher


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


def test_buckets_hashed_around_another_centre_never_mix() -> None:
    rng = np.random.default_rng(2)
    v, c1, c2 = (unit(rng.standard_normal(64)) for _ in range(3))
    plain = Lsh.create(64, 8, 4, seed=7, name="minilm")
    one = Lsh.create(64, 8, 4, seed=7, center=c1, name="minilm")
    two = Lsh.create(64, 8, 4, seed=7, center=c2, name="minilm")
    assert len({plain.tag, one.tag, two.tag}) == 3 and one.tag.startswith(plain.tag + ".c")
    assert not set(plain.band_keys(v)) & set(one.band_keys(v))
    assert not set(one.band_keys(v)) & set(two.band_keys(v))
    # The same centre (from a float64 copy too) names the same buckets in every process.
    again = Lsh.create(64, 8, 4, seed=7, center=c1.astype(np.float64), name="minilm")
    assert again.tag == one.tag and again.band_keys(v) == one.band_keys(v)
    with pytest.raises(ValueError, match=r"a centre of shape \(32,\) for 64-dimensional vectors"):
        Lsh.create(64, 8, 4, center=c1[:32])


async def test_with_a_centre_a_stored_vector_still_finds_itself_at_cosine_one() -> None:
    rng = np.random.default_rng(5)
    cone = unit(rng.standard_normal(64))  # vectors in a narrow cone, centred on its axis
    vectors = [unit(cone * 4 + rng.standard_normal(64) * 0.5) for _ in range(40)]
    m = matcher()
    centred = Lsh.create(64, 4, 12, seed=1, center=np.mean(vectors, axis=0), name="words")
    m.lsh = centred
    store = MemoryStore()
    for i, v in enumerate(vectors):
        await store.put(Put("s", str(i), b"a", 60_000, 100, "t", "m", v.tobytes(), tuple(m.lsh.band_keys(v))))
    for i, v in enumerate(vectors):
        ranked = m.ranked(v, await store.candidates("s", m.lsh.band_keys(v), 128))
        assert ranked[0][0] == str(i) and ranked[0][1] == pytest.approx(1.0, abs=1e-5)
