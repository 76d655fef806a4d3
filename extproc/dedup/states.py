"""Embeddings and token states for many texts at once, cached on disk (calibration, evaluation).

The gate itself computes these per request; calibration needs them for tens of thousands of
texts, so they are kept in one ``.npz`` per embedder (token vectors as float16) and only new
texts are run through the model.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SEP = "\x1f"


@dataclass
class StateStore:
    """text -> (sentence vector, pieces, token vectors)."""

    index: dict[str, int]
    vectors: np.ndarray  # float32 [n, dim]
    pieces: list[tuple[str, ...]]
    offsets: np.ndarray  # int64 [n + 1] into tokens
    tokens: np.ndarray  # float16 [total, dim]

    def vector(self, text: str) -> np.ndarray:
        v: np.ndarray = self.vectors[self.index[text]]
        return v

    def states(self, text: str) -> tuple[tuple[str, ...], np.ndarray]:
        i = self.index[text]
        tok: np.ndarray = self.tokens[self.offsets[i] : self.offsets[i + 1]].astype(np.float32)
        return self.pieces[i], tok


def _load(file: Path) -> StateStore | None:
    if not file.exists():
        return None
    with np.load(file, allow_pickle=False) as z:
        texts = z["texts"].tolist()
        pieces = [tuple(p.split(_SEP)) if p else () for p in z["pieces"].tolist()]
        return StateStore(
            {t: i for i, t in enumerate(texts)}, z["vectors"], pieces, z["offsets"], z["tokens"]
        )


def read_states(
    embedder: object,
    texts: list[str],
    cache: Path | None,
    batch: int = 256,
    run: Callable[[list[str]], tuple[np.ndarray, list[Any]]] | None = None,
) -> StateStore:
    """Every text's vector and token states; new texts are run once and added to the cache.
    ``run`` (default ``embedder.embed_with_states``) reads a batch: a caller that wants more of
    the same forward pass (another layer's states) passes its own."""
    from extproc.embed.encoder import OnnxEmbedder

    assert isinstance(embedder, OnnxEmbedder)
    run = run or embedder.embed_with_states
    file = cache / f"{embedder.name}.states.npz" if cache else None
    old = _load(file) if file is not None else None
    known = old.index if old is not None else {}
    missing = sorted({t for t in texts if t not in known})
    if not missing and old is not None:
        return old
    t0 = time.perf_counter()
    new_vec: list[np.ndarray] = []
    new_pieces: list[tuple[str, ...]] = []
    new_tok: list[np.ndarray] = []
    for i in range(0, len(missing), batch):
        vec, states = run(missing[i : i + batch])
        new_vec.append(vec)
        for s in states:
            new_pieces.append(s.pieces)
            new_tok.append(s.vectors.astype(np.float16))
    print(
        f"  read {len(missing)} texts with {embedder.name} in {time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
    )
    all_texts = (list(known) if old is not None else []) + missing
    vectors = np.concatenate(([old.vectors] if old is not None else []) + new_vec)
    pieces = (old.pieces if old is not None else []) + new_pieces
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.concatenate(([old.tokens] if old is not None else []) + new_tok)
    store = StateStore({t: i for i, t in enumerate(all_texts)}, vectors, pieces, offsets, tokens)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(".tmp.npz")
        np.savez(
            tmp,
            texts=np.array(all_texts),
            vectors=vectors,
            pieces=np.array([_SEP.join(p) for p in pieces]),
            offsets=offsets,
            tokens=tokens,
        )
        tmp.replace(file)
    return store
