"""Write a BERT sentence encoder as an ONNX graph from plain numpy weights (no PyTorch).

Inputs ``input_ids``/``attention_mask`` (int64 [batch, seq]); output ``embedding``
(float32 [batch, hidden]): masked mean pooling over the last layer, L2-normalised.

Linear weights are fp32 (``MatMul``) or 4-bit blocks kept as ``com.microsoft`` ``MatMulNBits``
(weights stay 4-bit; activations are quantised per row and block at ``accuracy_level`` 4, so
a row's result never depends on the other rows of its batch, unlike ONNX Runtime's dynamic
int8 quantisation, whose per-tensor activation scale couples a text to its batch neighbours).
Padding keys get -10000 before the softmax, which underflows to an exact 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class Q4:
    """A [rows, cols] matrix as 4-bit blocks of 32: nibbles (0..15, in order) and scales; w=(q-8)*d."""

    nibbles: np.ndarray  # uint8 [rows, cols // 32, 32]
    scales: np.ndarray  # float32 [rows, cols // 32]

    @property
    def shape(self) -> tuple[int, int]:
        rows, blocks, _ = self.nibbles.shape
        return rows, blocks * 32

    @classmethod
    def quantize(cls, w: np.ndarray) -> Q4:
        rows, cols = w.shape
        blocks = w.astype(np.float32).reshape(rows, cols // 32, 32)
        amax_idx = np.abs(blocks).argmax(axis=-1)
        peak = np.take_along_axis(blocks, amax_idx[..., None], axis=-1)[..., 0]
        d = (peak / -8.0).astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.round(blocks * inv[..., None]) + 8, 0, 15).astype(np.uint8)
        return cls(q, d)


Weight = np.ndarray | Q4


@dataclass
class BertWeights:
    """Weights in PyTorch's layout (Linear: [out, in])."""

    word: np.ndarray | Q4  # [vocab, hidden]
    position: np.ndarray  # [max_positions, hidden]
    token_type: np.ndarray  # [hidden] (type 0)
    emb_ln: tuple[np.ndarray, np.ndarray]
    layers: list[dict[str, Weight]] = field(default_factory=list)
    heads: int = 12
    eps: float = 1e-12


class _Graph:
    def __init__(self, accuracy_level: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.accuracy_level = accuracy_level
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op: str, inputs: list[str], hint: str = "", domain: str = "", **attrs: object) -> str:
        out = self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], out, None, domain, **attrs))  # type: ignore[arg-type]
        return out

    def linear(self, x: str, w: Weight, b: np.ndarray, hint: str) -> str:
        if isinstance(w, Q4):
            n, k = w.shape
            nib = w.nibbles
            packed = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)  # [n, blocks, 16]
            y = self.op(
                "MatMulNBits",
                [x, self.const(hint + "_q4", packed), self.const(hint + "_scale", w.scales.reshape(-1))],
                hint,
                domain="com.microsoft",
                K=k,
                N=n,
                bits=4,
                block_size=32,
                accuracy_level=self.accuracy_level,
            )
        else:
            y = self.op("MatMul", [x, self.const(hint + "_w", w.T.astype(np.float32))], hint)
        return self.op("Add", [y, self.const(hint + "_b", b.astype(np.float32))])

    def layernorm(self, x: str, wb: tuple[np.ndarray, np.ndarray], eps: float) -> str:
        return self.op(
            "LayerNormalization",
            [x, self.const("ln_w", wb[0].astype(np.float32)), self.const("ln_b", wb[1].astype(np.float32))],
            axis=-1,
            epsilon=eps,
        )

    def embed(self, ids: str, table: np.ndarray | Q4) -> str:
        if not isinstance(table, Q4):
            return self.op("Gather", [self.const("word", table.astype(np.float32)), ids], axis=0)
        nib = table.nibbles
        rows = nib.shape[0]
        packed = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8).reshape(rows, -1)
        zp = np.full((rows, nib.shape[1] // 2), 0x88, dtype=np.uint8)
        return self._embed_q4(ids, packed, table.scales, zp)

    def _embed_q4(self, ids: str, packed: np.ndarray, scales: np.ndarray, zp: np.ndarray) -> str:
        return self.op(
            "GatherBlockQuantized",
            [self.const("word_q4", packed), ids, self.const("word_scale", scales), self.const("word_zp", zp)],
            domain="com.microsoft",
            gather_axis=0,
            quantize_axis=1,
            block_size=32,
            bits=4,
        )


def build_bert(w: BertWeights, accuracy_level: int = 4) -> onnx.ModelProto:
    g = _Graph(accuracy_level)
    hidden = w.position.shape[1]
    heads = w.heads
    hd = hidden // heads

    ids, mask = "input_ids", "attention_mask"
    x = g.embed(ids, w.word)
    seq = g.op("Shape", [ids], start=1, end=2)  # [L], 1-D
    zero = g.const("zero", np.array([0], np.int64))
    pos = g.op("Slice", [g.const("position", w.position.astype(np.float32)), zero, seq, zero])
    x = g.op("Add", [x, g.op("Add", [pos, g.const("type0", w.token_type.astype(np.float32))])])
    x = g.layernorm(x, w.emb_ln, w.eps)

    maskf = g.op("Cast", [mask], to=TensorProto.FLOAT)
    bias = g.op(
        "Mul",
        [
            g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), maskf]),
            g.const("neg", np.array(-10000.0, np.float32)),
        ],
    )
    bias = g.op("Unsqueeze", [bias, g.const("axes", np.array([1, 2], np.int64))])  # [B,1,1,L]
    split = g.const("heads_shape", np.array([0, 0, heads, hd], np.int64))
    merge = g.const("merge_shape", np.array([0, 0, hidden], np.int64))
    scale = g.const("scale", np.array(1.0 / np.sqrt(hd), np.float32))

    def heads_of(x: str, ly: dict[str, Weight], name: str, hint: str, perm: list[int]) -> str:
        y = g.linear(x, ly[name + ".w"], _arr(ly[name + ".b"]), hint)
        return g.op("Transpose", [g.op("Reshape", [y, split])], perm=perm)

    for i, ly in enumerate(w.layers):
        q = heads_of(x, ly, "q", f"l{i}_q", [0, 2, 1, 3])
        k = heads_of(x, ly, "k", f"l{i}_k", [0, 2, 3, 1])
        v = heads_of(x, ly, "v", f"l{i}_v", [0, 2, 1, 3])
        att = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias])
        att = g.op("Softmax", [att], axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [att, v])], perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, merge])
        ao = g.linear(ctx, ly["ao.w"], _arr(ly["ao.b"]), f"l{i}_ao")
        x = g.layernorm(g.op("Add", [x, ao]), (_arr(ly["aln.w"]), _arr(ly["aln.b"])), w.eps)
        mid = g.linear(x, ly["fi.w"], _arr(ly["fi.b"]), f"l{i}_fi")
        erf = g.op("Erf", [g.op("Div", [mid, g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])])
        mid = g.op(
            "Mul",
            [
                g.op("Mul", [mid, g.op("Add", [erf, g.const("one_g", np.array(1.0, np.float32))])]),
                g.const("half", np.array(0.5, np.float32)),
            ],
        )
        fo = g.linear(mid, ly["fo.w"], _arr(ly["fo.b"]), f"l{i}_fo")
        x = g.layernorm(g.op("Add", [x, fo]), (_arr(ly["oln.w"]), _arr(ly["oln.b"])), w.eps)

    m3 = g.op("Unsqueeze", [maskf, g.const("axis2", np.array([2], np.int64))])
    summed = g.op("ReduceSum", [g.op("Mul", [x, m3]), g.const("axis1", np.array([1], np.int64))], keepdims=0)
    count = g.op("ReduceSum", [maskf, g.const("axis1b", np.array([1], np.int64))], keepdims=1)
    mean = g.op("Div", [summed, g.op("Max", [count, g.const("one_c", np.array(1.0, np.float32))])])
    norm = g.op("ReduceL2", [mean, g.const("axism", np.array([1], np.int64))], keepdims=1)
    norm = g.op("Max", [norm, g.const("tiny", np.array(1e-12, np.float32))])
    g.nodes.append(helper.make_node("Div", [mean, norm], ["embedding"], name="embedding"))

    graph = helper.make_graph(
        g.nodes,
        "bert_sentence_encoder",
        [
            helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])],
        g.inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
        producer_name="llm-gate",
    )
    model.ir_version = 8
    return model


def _arr(w: Weight) -> np.ndarray:
    assert isinstance(w, np.ndarray)
    return w
