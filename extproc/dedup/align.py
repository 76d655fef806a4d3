"""Alignment features from the embedder's token states (BERTScore-style), no extra model run.

Each content piece of one prompt is matched to its most similar piece of the other. A synonym
or a reworded phrase still finds a close partner; a changed object, name or action does not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .guards import _EN_FUNCTION, _ZH_FUNCTION

ALIGN_FEATURES = (
    "align_f",
    "align_min",
    "align_worst",
    "align_second_worst",
    "align_unmatched",
    "align_loose",
)
UNMATCHED_BELOW = 0.8  # a content piece whose best partner is less similar than this is unmatched
LOOSE_BELOW = 0.9  # ... and one below this only loosely matched


def content_mask(pieces: Sequence[str]) -> np.ndarray:
    """Pieces that carry content: not punctuation, not a function word or character."""
    out = np.zeros(len(pieces), dtype=bool)
    for i, p in enumerate(pieces):
        w = p.replace("▁", "").replace("##", "").casefold()
        if not w or not any(ch.isalnum() for ch in w):
            continue
        if w in _EN_FUNCTION or all(ch in _ZH_FUNCTION for ch in w):
            continue
        out[i] = True
    return out


def alignment(
    pieces_a: Sequence[str], states_a: np.ndarray, pieces_b: Sequence[str], states_b: np.ndarray
) -> np.ndarray:
    """ALIGN_FEATURES for two prompts' token states (rows L2-normalised)."""
    if not len(pieces_a) or not len(pieces_b):
        return np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    sim = states_a @ states_b.T
    best_a = sim.max(axis=1)  # each piece of a: its closest piece of b
    best_b = sim.max(axis=0)
    ca, cb = content_mask(pieces_a), content_mask(pieces_b)
    ra = best_a[ca] if ca.any() else best_a
    rb = best_b[cb] if cb.any() else best_b
    p, r = float(ra.mean()), float(rb.mean())
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    both = np.sort(np.concatenate([ra, rb]))
    worst = float(both[0])
    second = float(both[1]) if len(both) > 1 else worst
    unmatched = float((both < UNMATCHED_BELOW).sum())
    loose = float((both < LOOSE_BELOW).sum())
    return np.array([f, min(p, r), worst, second, unmatched, loose])
