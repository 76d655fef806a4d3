"""``load_embedder(name, model_dir, **opts)``: the built models by name, or an operator's ONNX.

Built models (``python -m extproc.embed.build``) carry an ``embedder.json`` next to the
ONNX file that says how to tokenize, prefix and pool, and which scripts the model reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .encoder import OnnxEmbedder, ReadPolicy
from .paths import default_model_dir
from .tokenize import E5Pieces, HFTokenizer

NAMES = ("minilm", "e5-small", "onnx")
SHARED_MAX = 4  # models kept for reuse (the cache's, the screen's, a profile's)
_shared: dict[tuple[object, ...], OnnxEmbedder] = {}


def _model_path(name: str, model_dir: Path) -> Path:
    for candidate in (model_dir / name, model_dir):
        if (candidate / "embedder.json").exists():
            return candidate
    raise FileNotFoundError(
        f"embedder {name!r}: no built model under {model_dir}; "
        "run `python -m extproc.embed.build --out DIR` (README: Embedding models)"
    )


def load_embedder(name: str, model_dir: Path | None = None, **opts: Any) -> OnnxEmbedder:
    """Options: threads (1), max_tokens, max_batch (64), max_unknown_fraction (0.0), scripts,
    lower_layers (0: token states carry the input of the top that many layers too, for the
    cross judge); for ``onnx`` also model_file, tokenizer_file, pooling ("mean"|"cls"), prefix
    (""), label."""
    root = model_dir or default_model_dir()
    threads = int(opts.pop("threads", 1))
    max_batch = int(opts.pop("max_batch", 64))
    lower_layers = int(opts.pop("lower_layers", 0))
    if name == "onnx":
        return _load_generic(root, threads, max_batch, opts)
    if name not in NAMES:
        raise ValueError(f"unknown embedder {name!r}; expected one of {', '.join(NAMES)}")
    path = _model_path(name, root)
    meta = json.loads((path / "embedder.json").read_text(encoding="utf-8"))
    max_tokens = int(opts.pop("max_tokens", meta.get("max_tokens", 256)))
    scripts = opts.pop("scripts", meta.get("scripts"))
    read = ReadPolicy(
        scripts=frozenset(scripts) if scripts else None,
        max_unknown_fraction=float(opts.pop("max_unknown_fraction", 0.0)),
        max_tokens=max_tokens,
    )
    if opts:
        raise TypeError(f"unknown options for {name}: {sorted(opts)}")
    tokenizer: E5Pieces | HFTokenizer
    if meta["kind"] == "e5":
        tokenizer = E5Pieces(path, max_tokens)
    else:
        tokenizer = HFTokenizer(path / "tokenizer.json", max_tokens)
    return OnnxEmbedder(
        name,
        path / "model.onnx",
        tokenizer,
        prefix=meta.get("prefix", ""),
        pooling=meta.get("pooling", "mean"),
        read=read,
        threads=threads,
        max_batch=max_batch,
        lower_layers=lower_layers,
    )


def _load_generic(root: Path, threads: int, max_batch: int, opts: dict[str, Any]) -> OnnxEmbedder:
    model_file = Path(opts.pop("model_file", root / "model.onnx"))
    tokenizer_file = Path(opts.pop("tokenizer_file", root / "tokenizer.json"))
    max_tokens = int(opts.pop("max_tokens", 256))
    scripts = opts.pop("scripts", None)
    read = ReadPolicy(
        scripts=frozenset(scripts) if scripts else None,
        max_unknown_fraction=float(opts.pop("max_unknown_fraction", 0.0)),
        max_tokens=max_tokens,
    )
    name = str(opts.pop("label", "onnx"))
    pooling = str(opts.pop("pooling", "mean"))
    prefix = str(opts.pop("prefix", ""))
    if pooling not in ("mean", "cls"):
        raise ValueError(f"pooling must be 'mean' or 'cls', not {pooling!r}")
    if opts:
        raise TypeError(f"unknown options for onnx: {sorted(opts)}")
    return OnnxEmbedder(
        name,
        model_file,
        HFTokenizer(tokenizer_file, max_tokens),
        prefix=prefix,
        pooling=pooling,
        read=read,
        threads=threads,
        max_batch=max_batch,
    )


def shared_embedder(name: str, model_dir: Path | None = None, **opts: Any) -> OnnxEmbedder:
    """`load_embedder`, loaded once per process for the same files and options. A config
    reload builds its pipeline beside the running one: loading a model again held the event
    loop for up to 0.2 s at a time (the tokenizer's load keeps the GIL), in every process at
    once. An ONNX Runtime session and the tokenizers are safe to share between threads."""
    root = model_dir or default_model_dir()
    if name == "onnx":
        files = [Path(opts.get("model_file", root / "model.onnx")),
                 Path(opts.get("tokenizer_file", root / "tokenizer.json"))]
    else:
        files = sorted(p for p in _model_path(name, root).iterdir() if p.is_file())
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    key = (name, str(root), repr(sorted(opts.items())), stamp)
    embedder = _shared.get(key)
    if embedder is None:
        embedder = load_embedder(name, model_dir, **opts)
        if len(_shared) >= SHARED_MAX:
            _shared.pop(next(iter(_shared)))
        _shared[key] = embedder
    return embedder
