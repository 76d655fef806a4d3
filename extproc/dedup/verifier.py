"""The verifier: logistic regression over a handful of explainable pair features.

It sees pairs the guards let through and that clear the embedder's cosine floor, and says how
likely they ask the same question. Fitted by ``extproc.dedup.calibrate`` (numpy IRLS),
shipped as JSON, evaluated on pairs not used for fitting.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np

from .align import ALIGN_FEATURES
from .canonical import canonical
from .guards import _content, guard_verdict, swapped, tokens

FEATURES = (
    "cosine",
    "char_bigram_jaccard",
    "token_jaccard",
    "sequence_ratio",
    "length_ratio",
    "unmatched_content",
    "extra_content_words",
    "substitution",
    "insertion",
    "soft_differences",
    *ALIGN_FEATURES,
)


def _bigrams(s: str) -> set[str]:
    s = s.replace(" ", "")
    return {s[i : i + 2] for i in range(len(s) - 1)} or {s}


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def features(a: str, b: str, cosine: float, align: np.ndarray) -> np.ndarray:
    """The verifier's inputs; ``align`` from :func:`extproc.dedup.align.alignment`."""
    ca, cb = canonical(a), canonical(b)
    swap = swapped(a, b)
    ta, tb = tokens(a), tokens(b)
    ua, ub = _content(ta), _content(tb)
    extra_a = sum(1 for t in ua if t not in set(tb))
    extra_b = sum(1 for t in ub if t not in set(ta))
    miss_a, miss_b = extra_a / max(len(ua), 1), extra_b / max(len(ub), 1)
    return np.array(
        [
            cosine,
            _jaccard(_bigrams(ca), _bigrams(cb)),
            _jaccard(set(ta), set(tb)),
            SequenceMatcher(None, ca, cb, autojunk=False).ratio(),
            min(len(ca), len(cb)) / max(len(ca), len(cb), 1),
            max(miss_a, miss_b),
            float(min(extra_a + extra_b, 8)),
            float(swap == "substitution"),
            float(swap == "insertion"),
            float(guard_verdict(a, b, ())[1]),
            *(float(v) for v in align),
        ],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class Verifier:
    weights: tuple[float, ...]
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]

    def score(self, x: np.ndarray) -> np.ndarray:
        """Probability of "same question" per row of ``x`` (a 0-d array for one pair)."""
        z = (x - np.asarray(self.mean)) / np.asarray(self.scale)
        logit = z @ np.asarray(self.weights) + self.bias
        p: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(logit, -40, 40)))
        return p

    def explain(self, x: np.ndarray) -> dict[str, float]:
        """Each feature's contribution to the logit (what made the score)."""
        z = (x - np.asarray(self.mean)) / np.asarray(self.scale)
        return {name: float(v) for name, v in zip(FEATURES, z * np.asarray(self.weights), strict=True)}

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(FEATURES),
            "weights": list(self.weights),
            "bias": self.bias,
            "mean": list(self.mean),
            "scale": list(self.scale),
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Verifier:
        if d.get("features") != list(FEATURES):
            raise ValueError(f"verifier features {d.get('features')} != {list(FEATURES)}")

        def floats(key: str) -> tuple[float, ...]:
            v = d[key]
            assert isinstance(v, list)
            return tuple(float(x) for x in v)

        bias = d["bias"]
        assert isinstance(bias, (int, float))
        return cls(floats("weights"), float(bias), floats("mean"), floats("scale"))


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iterations: int = 50) -> Verifier:
    """L2-regularised logistic regression by Newton's method on standardised features."""
    mean = x.mean(axis=0)
    scale = np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    reg = np.full(z.shape[1], l2)
    reg[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -40, 40)))
        grad = z.T @ (p - y) + reg * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return Verifier(
        tuple(map(float, w[:-1])), float(w[-1]), tuple(map(float, mean)), tuple(map(float, scale))
    )
