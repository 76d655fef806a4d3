"""The injection screen's head: a score in [0, 1] from a prompt's embedding and its text.

Two parts whose logits add up, trained together (`load/screen/train.py`):

- over the embedding: a logistic regression or a one-hidden-layer MLP; the MLP may also read
  three numbers on how the text is written (`shape_features`: floods of one pattern, glitch
  tokens said over and over, symbol soup), which no embedding of its first tokens shows;
- over the text itself (optional): a linear model on hashed character n-grams of the whole
  text (lower-cased, whitespace collapsed; a long text is read at its start and its end). The
  embedding reads only the first `MAX_TOKENS` tokens; the n-grams also see an instruction
  written after a long preamble, and the exact wording of attacks ("ignore … instructions").

Stored as a small `.npz` in extproc/data/. Scoring is pure numpy: a few hundred
multiply-adds on one vector and one hash per n-gram; no model runtime.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EMBEDDER = "e5-small"  # reads Chinese and English; the head is trained on its vectors
MAX_TOKENS = 128  # the prompt's start carries its framing; longer texts cost more to embed
HEAD_FILE = Path(__file__).resolve().parent.parent / "data" / "screen_head.npz"

LEX_ORDERS = (2, 3, 4, 5)  # character n-gram lengths
LEX_EDGE = 1024  # a text longer than twice this is read at its first and last LEX_EDGE characters
SHAPE_CHARS = 1024  # the shape features read this much of a text
SHAPE_SCALE = 4.0  # their scale beside the unit-length embedding
SHAPES = 3  # how many there are
_SYMBOL = re.compile(r"[^\w\s]")
_P = np.uint64(1_000_003)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_MASK = np.uint64(0xFFFFFFFF)


def lexical_ids(text: str, bits: int, orders: tuple[int, ...] = LEX_ORDERS) -> np.ndarray:
    """The distinct hashed n-gram buckets of a text (sorted, int64, in [0, 2**bits)).

    The hash is fixed (a polynomial over code points, then Fibonacci hashing), so the ids do
    not depend on the process or the platform."""
    if len(text) > 4 * LEX_EDGE:  # bounds the cost of a very long text
        text = text[: 2 * LEX_EDGE] + " " + text[-2 * LEX_EDGE :]
    t = " ".join(text.lower().split())
    if len(t) > 2 * LEX_EDGE:
        t = t[:LEX_EDGE] + " " + t[-LEX_EDGE:]
    c = np.frombuffer(f" {t} ".encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    h = c
    parts = []
    shift = np.uint64(64 - bits)
    for n in range(2, max(orders) + 1):
        h = ((h[:-1] * _P) + c[n - 1 :]) & _MASK  # h[i]: the n characters from i
        if n in orders and len(h):
            parts.append(((h + np.uint64(n << 32)) * _GOLD) >> shift)
    if not parts:
        return np.zeros(0, np.int64)
    ids = np.sort(np.concatenate(parts).astype(np.int32))  # np.unique is several times slower here
    return ids[np.concatenate(([True], ids[1:] != ids[:-1]))].astype(np.int64)


def shape_features(text: str) -> np.ndarray:
    """How a text is written, apart from what it says, scaled to sit beside the embedding:
    the share of its character 3-grams that repeat earlier ones, how far it compresses, and
    its share of symbols. A question is none of these; a flood of `) ] } ) ] }`, a glitch
    token said twenty times or a wall of symbols is all of them. Length is left out on
    purpose: the public jailbreaks are long and the benign sets short, and a head that
    learned that would flag long ordinary texts."""
    head = " ".join(text.split())[:SHAPE_CHARS]
    grams = max(len(head) - 2, 1)
    repeated = 1.0 - len({head[i : i + 3] for i in range(grams)}) / grams
    raw = head.encode()
    compressed = len(zlib.compress(raw)) / max(len(raw), 1)
    symbols = len(_SYMBOL.findall(head)) / max(len(head), 1)
    return SHAPE_SCALE * np.array([repeated, compressed, symbols])


def with_shape(vectors: np.ndarray, texts: list[str]) -> np.ndarray:
    """Embeddings (one, or one row per text) with each text's `shape_features` beside them:
    what a shape head's MLP reads."""
    shapes = np.array([shape_features(t) for t in texts])
    return np.hstack([vectors, shapes[0] if vectors.ndim == 1 else shapes])


@dataclass(frozen=True)
class Head:
    kind: str  # "logistic" or "mlp" (the embedding part); "+lex" when the text part is there
    w1: np.ndarray  # logistic: (dim,); mlp: (dim, hidden)
    b1: np.ndarray
    w2: np.ndarray | None  # mlp only: (hidden,)
    b2: float
    threshold: float  # the trained operating point (a benign false-positive rate target)
    embedder: str
    lex: np.ndarray | None = None  # (2**lex_bits,): one weight per hashed n-gram bucket
    shape: bool = False  # the MLP also reads `shape_features` of the text

    @property
    def dim(self) -> int:
        """The length of the embedding it reads."""
        return int(self.w1.shape[0]) - (SHAPES if self.shape else 0)

    @property
    def lex_bits(self) -> int:
        return int(self.lex.shape[0]).bit_length() - 1 if self.lex is not None else 0

    def _embedding_logits(self, vectors: np.ndarray, texts: list[str] | None = None) -> np.ndarray:
        if self.shape:
            if texts is None:
                raise ValueError("this head also reads how the text is written: pass it")
            vectors = with_shape(vectors, texts)
        if self.w2 is None:
            return np.asarray(vectors @ self.w1 + self.b1.reshape(-1)[0])
        return np.asarray(np.maximum(vectors @ self.w1 + self.b1, 0.0) @ self.w2 + self.b2)

    def lexical_logit(self, text: str) -> float:
        if self.lex is None:
            return 0.0
        ids = lexical_ids(text, self.lex_bits)
        return float(self.lex[ids].sum()) / float(np.sqrt(max(len(ids), 1)))

    def fingerprint(self) -> str:
        """What its scores depend on (weights and embedder; not the threshold), in 16 hex digits."""
        h = hashlib.blake2b(self.embedder.encode(), digest_size=8)
        for part in (self.w1, self.b1, self.w2, np.float64(self.b2), self.lex):
            if part is not None:
                h.update(np.ascontiguousarray(part).tobytes())
        if self.shape:
            h.update(b"shape")
        return h.hexdigest()

    def score(self, vector: np.ndarray, text: str | None = None) -> float:
        if self.lex is not None and text is None:
            raise ValueError("this head also reads the text: pass it")
        z = float(self._embedding_logits(vector, None if text is None else [text]))
        z += self.lexical_logit(text) if text is not None else 0.0
        return 1.0 / (1.0 + np.exp(-z)) if z > -60 else 0.0

    def scores(self, vectors: np.ndarray, texts: list[str] | None = None) -> np.ndarray:
        if self.lex is not None and texts is None:
            raise ValueError("this head also reads the texts: pass them")
        z = self._embedding_logits(vectors, texts)
        if self.lex is not None and texts is not None:
            z = z + np.array([self.lexical_logit(t) for t in texts])
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -60, 60))))

    def save(self, path: Path) -> None:
        arrays: dict[str, Any] = {
            "kind": self.kind, "b2": self.b2, "threshold": self.threshold, "embedder": self.embedder,
            "shape": self.shape,
            "w1": self.w1.astype(np.float32), "b1": np.asarray(self.b1, np.float32),
        }
        if self.w2 is not None:
            arrays["w2"] = self.w2.astype(np.float32)
        if self.lex is not None:
            arrays["lex"] = self.lex.astype(np.float16)
        np.savez_compressed(path, **arrays)


def load_head(path: Path = HEAD_FILE) -> Head:
    with np.load(path) as f:
        w2 = f["w2"].astype(np.float64) if "w2" in f.files else None
        lex = f["lex"].astype(np.float32) if "lex" in f.files else None
        return Head(str(f["kind"]), f["w1"].astype(np.float64), f["b1"].astype(np.float64), w2,
                    float(f["b2"]), float(f["threshold"]), str(f["embedder"]), lex,
                    "shape" in f.files and bool(f["shape"]))
