"""Random-hyperplane LSH: signature bands that put similar vectors in a shared bucket.

Two unit vectors at angle θ agree on one hyperplane's side with probability 1 - θ/π;
with `rows` planes per band and `bands` bands, they share at least one bucket with
probability 1 - (1 - p^rows)^bands. `choose` picks the most selective (rows, bands) that
still finds a pair at the operating cosine with the target probability; load/lsh_recall.py
measures the recall against brute force on real embeddings.

The planes come from a seed, so every gate process and replica computes the same buckets.
`center` (optional) is subtracted first: sentence encoders put most vectors in a narrow
cone, and hashing around the cone's axis spreads them over the buckets. Only the buckets
move: the cosines that rank candidates and decide are taken on the raw vectors. The tag
carries a digest of the centre, so buckets hashed around another centre (or none) never mix.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np


def collision(cosine: float, rows: int, bands: int) -> float:
    """Probability that two vectors at this cosine share at least one band."""
    p = 1.0 - math.acos(max(-1.0, min(1.0, cosine))) / math.pi
    return 1.0 - (1.0 - p**rows) ** bands


def choose(min_cosine: float, target: float = 0.995, max_bands: int = 32) -> tuple[int, int]:
    """(rows, bands): the most rows per band (fewest false candidates) that reach `target`."""
    best = (1, 1)
    for rows in range(1, 33):
        bands = next((b for b in range(1, max_bands + 1) if collision(min_cosine, rows, b) >= target), None)
        if bands is None:
            break
        best = (rows, bands)
    return best


def center_digest(center: np.ndarray) -> str:
    """A short name for a centre: the same float32 values, the same name, in every process."""
    data = np.ascontiguousarray(center, dtype="<f4").tobytes()
    return hashlib.sha256(data).hexdigest()[:10]


@dataclass(frozen=True)
class Lsh:
    planes: np.ndarray  # [bands * rows, dim]
    rows: int
    bands: int
    center: np.ndarray | None = None
    tag: str = ""  # the embedder, parameters and centre: buckets of another hashing never mix

    @classmethod
    def create(
        cls, dim: int, rows: int, bands: int, seed: int = 0, center: np.ndarray | None = None, name: str = ""
    ) -> Lsh:
        planes = np.random.default_rng(seed).standard_normal((rows * bands, dim)).astype(np.float32)
        tag = f"{name}.{dim}.{rows}x{bands}.{seed}"
        if center is not None:
            center = np.ascontiguousarray(center, dtype=np.float32)
            if center.shape != (dim,):
                raise ValueError(f"a centre of shape {center.shape} for {dim}-dimensional vectors")
            tag += f".c{center_digest(center)}"
        return cls(planes, rows, bands, center, tag)

    @cached_property
    def _prefixes(self) -> list[str]:
        return [f"{self.tag}:{band}:" for band in range(self.bands)]

    @cached_property
    def _weights(self) -> np.ndarray:
        return 1 << np.arange(self.rows, dtype=np.int64)  # rows <= 63: a code fits in an int64

    def band_keys(self, vector: np.ndarray) -> list[str]:
        """One bucket name per band: `<tag>:<band>:<bits as hex>`."""
        v = vector if self.center is None else vector - self.center
        codes = ((self.planes @ v) > 0).reshape(self.bands, self.rows) @ self._weights
        return [f"{prefix}{code:x}" for prefix, code in zip(self._prefixes, codes.tolist(), strict=True)]
