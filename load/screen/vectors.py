"""Embeddings of the screen's texts with the gate's embedder, cached on disk by text.

`vectors` gives the sentence embedding the gate computes (the mean over the first MAX_TOKENS
tokens); `max_vectors` a second reading of the same forward pass, the largest value of each
dimension over the text's token states (a sweep option, not what the gate reads)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.safety.screen import EMBEDDER, MAX_TOKENS


def embedder(model_dir: Path | None = None, threads: int = 1) -> OnnxEmbedder:
    return load_embedder(EMBEDDER, model_dir, threads=threads, max_tokens=MAX_TOKENS)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _max_pooled(model: OnnxEmbedder, texts: list[str]) -> list[np.ndarray]:
    """Each text's token states (specials and prefix dropped) max-pooled, L2-normalised."""
    rows = []
    for st in model.embed_with_states(texts)[1]:
        m = st.vectors.max(axis=0) if len(st.vectors) else np.zeros(model.dim, np.float32)
        rows.append(m / max(float(np.linalg.norm(m)), 1e-12))
    return rows


def max_vectors(texts: list[str], cache: Path, model_dir: Path | None = None) -> np.ndarray:
    """One row per text: the max over its token states (`_max_pooled`), in a cache of its own."""
    return vectors(texts, cache.with_name(f"{cache.stem}_max.npz"), model_dir, read=_max_pooled)


def vectors(texts: list[str], cache: Path, model_dir: Path | None = None, batch: int = 64,
            read: Callable[[OnnxEmbedder, list[str]], Iterable[np.ndarray]] | None = None) -> np.ndarray:
    """One row per text; texts embedded once, ever, per cache file (`read`: how a batch is
    read; the sentence embedding when None)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    known: dict[str, np.ndarray] = {}
    if cache.exists():
        with np.load(cache) as stored:
            known = dict(zip(stored["keys"].tolist(), stored["vectors"], strict=True))
    keys = [_key(t) for t in texts]
    todo = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in known}.items(),
                  key=lambda kv: len(kv[1]))
    if todo:
        model = embedder(model_dir)
        for i in range(0, len(todo), batch):
            part = todo[i : i + batch]
            batch_texts = [t for _, t in part]
            rows = model.embed_sync(batch_texts) if read is None else read(model, batch_texts)
            for (k, _), v in zip(part, rows, strict=True):
                known[k] = v.astype(np.float32)
            if (i // batch) % 20 == 0:
                print(f"embedded {min(i + batch, len(todo))}/{len(todo)}", flush=True)
        np.savez(cache, keys=np.array(list(known)), vectors=np.stack(list(known.values())))
    return np.stack([known[k] for k in keys])
