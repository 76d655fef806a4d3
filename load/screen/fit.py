"""Fitting the screen's head: logistic regression and a one-hidden-layer MLP, numpy only,
full-batch Adam with L2, classes weighted equally, every random draw from one seed."""

from __future__ import annotations

import numpy as np

from extproc.safety.screen import EMBEDDER, Head


def _adam(params: list[np.ndarray], grads: list[np.ndarray], state: list[list[np.ndarray]], step: int,
          lr: float) -> None:
    b1, b2, eps = 0.9, 0.999, 1e-8
    for p, g, (m, v) in zip(params, grads, state, strict=True):
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        p -= lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps)


def _weights(y: np.ndarray) -> np.ndarray:
    pos = max(float(y.sum()), 1.0)
    neg = max(float(len(y) - y.sum()), 1.0)
    return np.where(y == 1, 0.5 / pos, 0.5 / neg)


def fit_logistic(x: np.ndarray, y: np.ndarray, seed: int, l2: float = 1e-4, steps: int = 600,
                 lr: float = 0.05) -> Head:
    rng = np.random.default_rng(seed)
    w: np.ndarray = np.asarray(rng.normal(0, 0.01, x.shape[1]))
    b = np.zeros(1)
    sw = _weights(y)
    state = [[np.zeros_like(w), np.zeros_like(w)], [np.zeros_like(b), np.zeros_like(b)]]
    for step in range(1, steps + 1):
        p = 1 / (1 + np.exp(-np.clip(x @ w + b[0], -60, 60)))
        err = (p - y) * sw
        _adam([w, b], [x.T @ err + l2 * w, np.array([err.sum()])], state, step, lr)
    return Head("logistic", w, b, None, 0.0, 0.5, EMBEDDER)


def fit_mlp(x: np.ndarray, y: np.ndarray, seed: int, hidden: int = 64, l2: float = 1e-4, steps: int = 600,
            lr: float = 0.01) -> Head:
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, np.sqrt(2 / x.shape[1]), (x.shape[1], hidden))
    b1 = np.zeros(hidden)
    w2 = rng.normal(0, np.sqrt(1 / hidden), hidden)
    b2 = np.zeros(1)
    sw = _weights(y)
    params = [w1, b1, w2, b2]
    state = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
    for step in range(1, steps + 1):
        h_pre = x @ w1 + b1
        h = np.maximum(h_pre, 0)
        p = 1 / (1 + np.exp(-np.clip(h @ w2 + b2[0], -60, 60)))
        err = (p - y) * sw
        g_w2 = h.T @ err + l2 * w2
        g_h = np.outer(err, w2) * (h_pre > 0)
        _adam(params, [x.T @ g_h + l2 * w1, g_h.sum(0), g_w2, np.array([err.sum()])], state, step, lr)
    return Head("mlp", w1, b1, w2, float(b2[0]), 0.5, EMBEDDER)


def threshold_at(benign_scores: np.ndarray, fpr: float) -> float:
    """The lowest threshold whose false-positive rate on these benign scores is at most `fpr`
    (a text is flagged when its score is above the threshold)."""
    s = np.sort(benign_scores)[::-1]
    allowed = int(np.floor(fpr * len(s)))
    return float(s[allowed]) if allowed < len(s) else 0.0


def detection_at(pos: np.ndarray, neg: np.ndarray, fpr: float) -> tuple[float, float]:
    """(detection rate, the threshold) at the benign false-positive rate `fpr`."""
    t = threshold_at(neg, fpr)
    return float((pos > t).mean()) if len(pos) else float("nan"), t
