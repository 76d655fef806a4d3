"""The pair judge's network, twice: in JAX for training (batched, padded, masked) and as an
ONNX graph for the gate (one pair, no padding). Both compute the same function of the same
weights; ``tests/dedup/test_judge.py`` holds them to it.

Per direction (a over b, then b over a, shared weights): project each token state
(``P = S W1 + b1``), align it softly with the other prompt's tokens (attention over the raw
cosine matrix at a learned temperature), compare (``[p, q, p - q, p * q, best cosine]``), a
ReLU layer, mean- and max-pool. The two directions combine symmetrically (sum and absolute
difference), join a ReLU layer over the two prompts' mean states (``|u - v|``, ``u * v``) and
the standardised pair features, and an MLP gives the logit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Params = dict[str, Any]
DIM = 384


def init_params(seed: int, features: int, d: int = 64, hidden: int = 64) -> Params:
    rng = np.random.default_rng(seed)

    def w(n_in: int, n_out: int) -> np.ndarray:
        out: np.ndarray = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        return out

    return {
        "w1": w(DIM, d),
        "b1": np.zeros(d, np.float32),
        "log_t": np.array(np.log(10.0), np.float32),
        "w2": w(4 * d + 1, d),
        "b2": np.zeros(d, np.float32),
        "w5": w(2 * DIM, d),
        "b5": np.zeros(d, np.float32),
        "w3": w(5 * d + features, hidden),
        "b3": np.zeros(hidden, np.float32),
        "w4": (rng.standard_normal((hidden, 1)) * 0.01).astype(np.float32),
        "b4": np.zeros(1, np.float32),
    }


def forward(p: Params, a: Any, ma: Any, b: Any, mb: Any, z: Any) -> Any:
    """Logits [n] for padded states a [n, La, 384], b [n, Lb, 384], masks ma [n, La], mb
    [n, Lb] (1 = token), standardised features z [n, F]."""
    import jax
    import jax.numpy as jnp

    t = jnp.exp(p["log_t"])
    s = jnp.einsum("nid,njd->nij", a, b)
    pa = a @ p["w1"] + p["b1"]
    pb = b @ p["w1"] + p["b1"]

    def side(pa: Any, pb: Any, s: Any, ma: Any, mb: Any) -> Any:
        off = (mb[:, None, :] - 1.0) * 1e9
        att = jax.nn.softmax(t * s + off, axis=-1)
        q = att @ pb
        best = jnp.max(s + off, axis=-1, keepdims=True)
        h = jax.nn.relu(jnp.concatenate([pa, q, pa - q, pa * q, best], -1) @ p["w2"] + p["b2"])
        m = ma[:, :, None]
        mean = (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
        top = jnp.max(h + (m - 1.0) * 1e9, axis=1)
        return jnp.concatenate([mean, top], -1)

    va = side(pa, pb, s, ma, mb)
    vb = side(pb, pa, jnp.swapaxes(s, 1, 2), mb, ma)
    u = (a * ma[:, :, None]).sum(1) / jnp.maximum(ma.sum(1, keepdims=True), 1.0)
    w = (b * mb[:, :, None]).sum(1) / jnp.maximum(mb.sum(1, keepdims=True), 1.0)
    g = jax.nn.relu(jnp.concatenate([jnp.abs(u - w), u * w], -1) @ p["w5"] + p["b5"])
    v = jnp.concatenate([va + vb, jnp.abs(va - vb), g, z], -1)
    hid = jax.nn.relu(v @ p["w3"] + p["b3"])
    return (hid @ p["w4"] + p["b4"])[:, 0]


def to_onnx(p: Params, mean: np.ndarray, scale: np.ndarray) -> Any:
    """The ONNX graph of :func:`forward` for one unpadded pair: inputs ``a`` [1, La, 384],
    ``b`` [1, Lb, 384], ``x`` [1, F] (raw features; standardised inside); output ``p`` [1]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = {k: np.asarray(v, np.float32) for k, v in p.items()}
    inits["t"] = np.exp(inits.pop("log_t")).reshape(1)
    inits["mean"] = np.asarray(mean, np.float32)
    inits["scale"] = np.asarray(scale, np.float32)
    inits["perm"] = np.array([0, 2, 1], np.int64)
    nodes: list[Any] = []

    def op(kind: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], name=out, **attrs))
        return out

    s = op("MatMul", ["a", op("Transpose", ["b"], "bt", perm=[0, 2, 1])], "s")
    pa = op("Add", [op("MatMul", ["a", "w1"], "aw1"), "b1"], "pa")
    pb = op("Add", [op("MatMul", ["b", "w1"], "bw1"), "b1"], "pb")

    def side(tag: str, pa: str, pb: str, s: str) -> str:
        att = op("Softmax", [op("Mul", [s, "t"], f"{tag}_ts")], f"{tag}_att", axis=-1)
        q = op("MatMul", [att, pb], f"{tag}_q")
        best = op("ReduceMax", [s, "axis_last"], f"{tag}_best", keepdims=1)
        diff = op("Sub", [pa, q], f"{tag}_diff")
        prod = op("Mul", [pa, q], f"{tag}_prod")
        cat = op("Concat", [pa, q, diff, prod, best], f"{tag}_cat", axis=-1)
        h = op("Relu", [op("Add", [op("MatMul", [cat, "w2"], f"{tag}_hw"), "b2"], f"{tag}_hb")], f"{tag}_h")
        mean = op("ReduceMean", [h, "axis_tokens"], f"{tag}_mean", keepdims=0)
        top = op("ReduceMax", [h, "axis_tokens"], f"{tag}_top", keepdims=0)
        return op("Concat", [mean, top], f"{tag}_v", axis=-1)

    inits["axis_last"] = np.array([-1], np.int64)
    inits["axis_tokens"] = np.array([1], np.int64)
    va = side("a", pa, pb, s)
    vb = side("b", pb, pa, op("Transpose", [s], "st", perm=[0, 2, 1]))
    z = op("Div", [op("Sub", ["x", "mean"], "xc"), "scale"], "z")
    both = op("Add", [va, vb], "vsum")
    apart = op("Abs", [op("Sub", [va, vb], "vsub")], "vabs")
    u = op("ReduceMean", ["a", "axis_tokens"], "u", keepdims=0)
    w = op("ReduceMean", ["b", "axis_tokens"], "w", keepdims=0)
    uw = op(
        "Concat",
        [op("Abs", [op("Sub", [u, w], "uw_sub")], "uw_abs"), op("Mul", [u, w], "uw_mul")],
        "uw",
        axis=-1,
    )
    g = op("Relu", [op("Add", [op("MatMul", [uw, "w5"], "gw5"), "b5"], "gb5")], "g")
    v = op("Concat", [both, apart, g, z], "v", axis=-1)
    hid = op("Relu", [op("Add", [op("MatMul", [v, "w3"], "hw3"), "b3"], "hb3")], "hid")
    logit = op("Add", [op("MatMul", [hid, "w4"], "hw4"), "b4"], "logit")
    prob = op("Sigmoid", [op("Reshape", [logit, "flat"], "logit1")], "p")
    inits["flat"] = np.array([-1], np.int64)
    del inits["perm"]
    features = int(inits["mean"].shape[0])
    graph = helper.make_graph(
        nodes,
        "pair_judge",
        pair_inputs(features),
        [helper.make_tensor_value_info(prob, TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(v, name=k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def from_onnx(model: Any) -> tuple[Params, np.ndarray, np.ndarray]:
    """The weights back out of a judge graph: (params, feature mean, feature scale)."""
    from onnx import numpy_helper

    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    p = {k: w[k] for k in ("w1", "b1", "w2", "b2", "w3", "b3", "w4", "b4", "w5", "b5")}
    p["log_t"] = np.log(w["t"].reshape(()))
    return p, w["mean"], w["scale"]


def pair_inputs(features: int) -> list[Any]:
    """A pair graph's inputs: both prompts' token states (one prompt each, any length) and the
    pair's standardised features."""
    from onnx import TensorProto, helper

    return [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, "la", DIM]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, "lb", DIM]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, features]),
    ]
