"""The LSH centre (`cache.semantic.lsh_center_file`): the traffic's mean embedding.

Prompts that share a long template sit in a narrow cone of the embedding space, so the
random hyperplanes put most of them on the same side and a few capped buckets hold nearly
everything (the cap then evicts true matches). Hashing around the cone's axis, the mean of
the traffic's embeddings, spreads them again (`load/lsh_recall.py --template`).

`llm-gate lsh-center` writes the centre: a `.npy` file of one float32 vector and, beside it,
`<file>.json` naming the embedder and dimension it was made with. A centre belongs to one
embedder: the gate refuses it for another one (or another dimension) at start, and
`llm-gate check-config` reports the same problems.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.encoder import Embedder
from ..request import split_last

# A mean of unit vectors has a norm of at most 1: a larger one is not such a mean.
MAX_NORM = 1.0 + 1e-3
CHUNK = 256  # texts embedded at a time by the command (bounded memory on big files)


class CenterError(ValueError):
    """A centre file that cannot be used, with what is wrong and what to do."""


def meta_path(path: Path) -> Path:
    """Where the centre's description (embedder, dimension) lies: `<file>.json`."""
    return path.with_name(path.name + ".json")


def read_center(path: Path, embedder: str, dim: int | None = None) -> np.ndarray:
    """The centre in `path`, checked: one finite float vector made with `embedder` (and of
    `dim` values, when given). Raises CenterError naming the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = np.load(f, allow_pickle=False)
    except OSError as exc:
        raise CenterError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except (ValueError, EOFError) as exc:
        raise CenterError(f"{path}: not a .npy file ({exc})") from exc
    if not isinstance(raw, np.ndarray) or raw.ndim != 1 or raw.size == 0:
        shape = getattr(raw, "shape", "?")
        raise CenterError(f"{path}: holds an array of shape {shape}; a centre is one vector")
    if raw.dtype.kind != "f":
        raise CenterError(f"{path}: holds {raw.dtype} values; a centre is a float32 vector")
    bad = int(np.count_nonzero(~np.isfinite(raw)))
    if bad:
        raise CenterError(f"{path}: {bad} of its {raw.size} values are not finite (NaN or infinity)")
    center = raw.astype(np.float32)
    norm = float(np.linalg.norm(center))
    if norm > MAX_NORM:
        raise CenterError(f"{path}: its norm is {norm:.3f}; a mean of unit embeddings is no longer than 1")
    made_with, made_dim = _read_meta(path)
    if made_dim != center.size:
        raise CenterError(f"{path}: holds {center.size} values; {meta_path(path).name} says dim {made_dim}")
    if made_with != embedder:
        raise CenterError(
            f"{path}: a centre of the '{made_with}' embedder cannot be used with the '{embedder}' embedder; "
            f"make one with `llm-gate lsh-center --embedder {embedder}`"
        )
    if dim is not None:
        check_dim(center, path, embedder, dim)
    return center


def check_dim(center: np.ndarray, path: Path, embedder: str, dim: int) -> None:
    """The loaded embedder's dimension is the last word (an `onnx` model may change it)."""
    if center.size != dim:
        raise CenterError(
            f"{path}: a {center.size}-dimensional centre cannot be used with the '{embedder}' "
            f"embedder, whose vectors have {dim} dimensions"
        )


def _read_meta(path: Path) -> tuple[str, int]:
    meta = meta_path(path)
    try:
        doc: Any = json.loads(meta.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CenterError(
            f"{meta}: missing; it names the embedder {path.name} was made with "
            "(`llm-gate lsh-center` writes both files)"
        ) from exc
    except OSError as exc:
        raise CenterError(f"{meta}: cannot read it ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise CenterError(f"{meta}: not JSON ({exc})") from exc
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("embedder"), str)
        or not isinstance(doc.get("dim"), int)
        or isinstance(doc.get("dim"), bool)
    ):
        raise CenterError(f"{meta}: must be a JSON object with 'embedder' (a name) and 'dim' (an integer)")
    return doc["embedder"], doc["dim"]


def write_center(path: Path, center: np.ndarray, embedder: str, prompts: int, source: str = "") -> None:
    """The vector (`.npy`, float32) and its description (`<file>.json`)."""
    vector = np.ascontiguousarray(center, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # a file object: np.save adds no `.npy` to the name
        np.save(f, vector, allow_pickle=False)
    meta = {
        "embedder": embedder,
        "dim": int(vector.size),
        "prompts": prompts,
        "norm": round(float(np.linalg.norm(vector)), 6),
        "source": source,
    }
    meta_path(path).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def read_prompts(path: Path) -> tuple[list[str], int]:
    """(texts the cache would embed, requests with none), from one prompt per line or from
    JSONL of OpenAI request bodies (a file whose first line is a JSON object): each body's
    comparable last message, the text the semantic cache embeds (`request.split_last`)."""
    numbered = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                if line.strip()]
    if not numbered or not _is_object(numbered[0][1]):
        return [line for _, line in numbered], 0
    texts: list[str] = []
    skipped = 0
    for number, line in numbered:
        try:
            body = json.loads(line)
        except ValueError as exc:
            raise CenterError(f"{path}:{number}: not a JSON request body ({exc})") from exc
        if not isinstance(body, dict):
            raise CenterError(f"{path}:{number}: not a JSON object (an OpenAI request body)")
        text = split_last(body)[1]
        if text is None or not text.strip():
            skipped += 1
        else:
            texts.append(text)
    return texts, skipped


def _is_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def mean_embedding(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """The float32 mean of the texts' (unit) embeddings, summed in float64."""
    total = np.zeros(embedder.dim, dtype=np.float64)
    for chunk in _chunks(texts, CHUNK):
        total += embedder.embed_sync(list(chunk)).sum(axis=0, dtype=np.float64)
    return (total / max(len(texts), 1)).astype(np.float32)


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def command(model_dir: Path, build_missing: bool, embedder: str, prompts: Path, out: Path) -> int:
    """`llm-gate lsh-center`: embed the prompts with `embedder`, write their mean to `out`."""
    from ..embed import load_embedder
    from .setup import ModelError, ensure_model

    try:
        texts, no_text = read_prompts(prompts)
    except OSError as exc:
        print(f"{prompts}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except (CenterError, UnicodeDecodeError) as exc:
        print(f"{prompts}: {exc}" if isinstance(exc, UnicodeDecodeError) else str(exc), file=sys.stderr)
        return 1
    if not texts:
        what = f" ({no_text} request(s) without a plain last user message)" if no_text else ""
        print(
            f"{prompts}: no prompts to embed{what}; give one prompt per line, or JSONL of OpenAI "
            "request bodies (each one's last user message is used)",
            file=sys.stderr,
        )
        return 1
    try:
        ensure_model(embedder, model_dir, build_missing)
        model = load_embedder(embedder, model_dir)
    except (ModelError, ValueError, FileNotFoundError) as exc:
        print(f"cannot load the '{embedder}' embedder: {exc}", file=sys.stderr)
        return 1
    readable = [t for t in texts if model.can_read(t)]
    if not readable:
        print(f"{prompts}: the '{embedder}' embedder can read none of its {len(texts)} prompts "
              "(too long, or in a script it does not read)", file=sys.stderr)
        return 1
    center = mean_embedding(model, readable)
    write_center(out, center, embedder, len(readable), str(prompts))
    norm = float(np.linalg.norm(center))
    print(f"{out}: the mean of {len(readable)} prompts' '{embedder}' embeddings ({center.size} dims), "
          f"norm {norm:.4f}")
    unused = len(texts) - len(readable)
    if no_text or unused:
        print(f"not used: {no_text} request(s) without a plain last user message, {unused} prompt(s) "
              f"the embedder cannot read (the cache never embeds either)")
    print(f"set cache.semantic.lsh_center_file: {out} (it reads {meta_path(out).name} beside it)")
    return 0
