"""Embeddings of the screen's texts with the gate's embedder, cached on disk by text."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.safety.screen import EMBEDDER, MAX_TOKENS


def embedder(model_dir: Path | None = None, threads: int = 1) -> OnnxEmbedder:
    return load_embedder(EMBEDDER, model_dir, threads=threads, max_tokens=MAX_TOKENS)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def vectors(texts: list[str], cache: Path, model_dir: Path | None = None, batch: int = 64) -> np.ndarray:
    """One row per text; texts embedded once, ever, per cache file."""
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
            for (k, _), v in zip(part, model.embed_sync([t for _, t in part]), strict=True):
                known[k] = v.astype(np.float32)
            if (i // batch) % 20 == 0:
                print(f"embedded {min(i + batch, len(todo))}/{len(todo)}", flush=True)
        np.savez(cache, keys=np.array(list(known)), vectors=np.stack(list(known.values())))
    return np.stack([known[k] for k in keys])
