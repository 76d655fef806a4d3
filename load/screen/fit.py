"""Fitting the screen's head: logistic regression and a one-hidden-layer MLP over the
embedding, a logistic regression over the text's hashed character n-grams, and their sum.
Full-batch Adam with L2, classes weighted equally, every random draw from one seed."""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import sparse  # type: ignore[import-untyped]

from extproc.safety.screen import EMBEDDER, Head, lexical_ids


class Lexical:
    """The texts' hashed n-grams as a sparse matrix: one row per text, its distinct buckets
    each 1/sqrt(their count) (scipy at training time only; scoring needs numpy alone)."""

    def __init__(self, texts: list[str], bits: int, matrix: sparse.csr_matrix | None = None) -> None:
        self.bits = bits
        if matrix is None:
            rows = [lexical_ids(t, bits) for t in texts]
            counts = np.array([len(r) for r in rows])
            indptr = np.concatenate([[0], np.cumsum(counts)])
            val = np.repeat(1 / np.sqrt(np.maximum(counts, 1)), counts)
            ids = np.concatenate(rows) if rows else np.zeros(0, np.int64)
            matrix = sparse.csr_matrix((val, ids, indptr), shape=(len(rows), 1 << bits))
        self.x = matrix
        self.xt = matrix.T.tocsr()

    def subset(self, mask: np.ndarray) -> Lexical:
        return Lexical([], self.bits, self.x[np.flatnonzero(mask)])

    def dot(self, w: np.ndarray) -> np.ndarray:
        return np.asarray(self.x @ w)

    def grad(self, err: np.ndarray) -> np.ndarray:
        return np.asarray(self.xt @ err)


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


def by_source(y: np.ndarray, sources: np.ndarray, labels: tuple[int, ...] = (0, 1)) -> np.ndarray:
    """Sample weights: each class half the total, and within a class of `labels` each source an
    equal share (a source of 64 hard benign prompts weighs as much as 2,500 CLINC150 requests;
    deepset's 160 short injections as much as 600 long in-the-wild jailbreaks)."""
    w = _weights(y)
    for label in labels:
        groups = sorted(set(sources[y == label].tolist()))
        for g in groups:
            m = (y == label) & (sources == g)
            w[m] = 0.5 / len(groups) / m.sum()
    return w


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
            lr: float = 0.01, sw: np.ndarray | None = None) -> Head:
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, np.sqrt(2 / x.shape[1]), (x.shape[1], hidden))
    b1 = np.zeros(hidden)
    w2 = rng.normal(0, np.sqrt(1 / hidden), hidden)
    b2 = np.zeros(1)
    sw = _weights(y) if sw is None else sw
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


def average(mlps: list[Head]) -> Head:
    """MLPs whose logits are averaged, stored as one wider MLP (their hidden units side by side,
    each output weight divided by their number): the same head format and scoring."""
    if len(mlps) == 1:
        return mlps[0]
    return dataclasses.replace(
        mlps[0], w1=np.hstack([h.w1 for h in mlps]), b1=np.concatenate([h.b1 for h in mlps]),
        w2=np.concatenate([np.asarray(h.w2) for h in mlps]) / len(mlps),
        b2=float(np.mean([h.b2 for h in mlps])))


def fit_mlps(x: np.ndarray, y: np.ndarray, seed: int, members: int,
             sw: np.ndarray | None = None, hidden: int = 64, steps: int = 600) -> list[Head]:
    """`members` MLPs from seeds seed, seed + 1, ... (`average` them: less of one start's luck)."""
    return [fit_mlp(x, y, seed + i, hidden=hidden, steps=steps, sw=sw) for i in range(members)]


def fit_lexical(lex: Lexical, y: np.ndarray, l2: float = 1e-4, steps: int = 300,
                lr: float = 0.05, sw: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """A logistic regression on the n-grams alone (weights from zero: no random draw)."""
    w = np.zeros(1 << lex.bits)
    b = np.zeros(1)
    sw = _weights(y) if sw is None else sw
    state = [[np.zeros_like(w), np.zeros_like(w)], [np.zeros_like(b), np.zeros_like(b)]]
    for step in range(1, steps + 1):
        p = 1 / (1 + np.exp(-np.clip(lex.dot(w) + b[0], -60, 60)))
        err = (p - y) * sw
        _adam([w, b], [lex.grad(err) + l2 * w, np.array([err.sum()])], state, step, lr)
    return w, float(b[0])


def combine(mlp: Head, lexical: tuple[np.ndarray, float], weight: float) -> Head:
    """One head whose logit is the MLP's plus `weight` times the n-gram model's: the two are
    fitted apart (fitted together, the MLP explains the training set alone and the n-grams
    learn next to nothing), then added."""
    w, b = lexical
    return dataclasses.replace(mlp, kind=mlp.kind + "+lex", b2=mlp.b2 + weight * b, lex=weight * w)


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
