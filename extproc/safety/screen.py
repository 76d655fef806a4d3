"""The injection screen's head: a score in [0, 1] from a prompt's embedding.

A logistic regression or a one-hidden-layer MLP (whichever measured better when trained,
`load/screen/train.py`), stored as a small `.npz` in extproc/data/. Scoring is a few
hundred multiply-adds on one vector: pure numpy, no model runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EMBEDDER = "e5-small"  # reads Chinese and English; the head is trained on its vectors
MAX_TOKENS = 128  # the prompt's start carries its framing; longer texts cost more to embed
HEAD_FILE = Path(__file__).resolve().parent.parent / "data" / "screen_head.npz"


@dataclass(frozen=True)
class Head:
    kind: str  # "logistic" or "mlp"
    w1: np.ndarray  # logistic: (dim,); mlp: (dim, hidden)
    b1: np.ndarray
    w2: np.ndarray | None  # mlp only: (hidden,)
    b2: float
    threshold: float  # the trained operating point (a benign false-positive rate target)
    embedder: str

    def score(self, vector: np.ndarray) -> float:
        if self.w2 is None:
            z = float(vector @ self.w1) + float(self.b1.reshape(-1)[0])
        else:
            hidden = np.maximum(vector @ self.w1 + self.b1, 0.0)
            z = float(hidden @ self.w2) + self.b2
        return 1.0 / (1.0 + np.exp(-z)) if z > -60 else 0.0

    def scores(self, vectors: np.ndarray) -> np.ndarray:
        if self.w2 is None:
            z = vectors @ self.w1 + self.b1
        else:
            z = np.maximum(vectors @ self.w1 + self.b1, 0.0) @ self.w2 + self.b2
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -60, 60))))

    def save(self, path: Path) -> None:
        arrays: dict[str, Any] = {
            "kind": self.kind, "b2": self.b2, "threshold": self.threshold, "embedder": self.embedder,
            "w1": self.w1.astype(np.float32), "b1": np.asarray(self.b1, np.float32),
        }
        if self.w2 is not None:
            arrays["w2"] = self.w2.astype(np.float32)
        np.savez_compressed(path, **arrays)


def load_head(path: Path = HEAD_FILE) -> Head:
    with np.load(path) as f:
        w2 = f["w2"].astype(np.float64) if "w2" in f.files else None
        return Head(str(f["kind"]), f["w1"].astype(np.float64), f["b1"].astype(np.float64), w2,
                    float(f["b2"]), float(f["threshold"]), str(f["embedder"]))
