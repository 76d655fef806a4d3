from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.embed.build import build_e5, build_minilm
from extproc.embed.encoder import letters_outside, plan_batches, script_of

from .sentences import MIXED


@pytest.mark.parametrize("name", ["e5", "minilm"])
def test_embedding_does_not_depend_on_its_batch(name: str, request: pytest.FixtureRequest) -> None:
    emb: OnnxEmbedder = request.getfixturevalue(name)
    alone = np.stack([emb.embed_sync([t])[0] for t in MIXED])
    together = emb.embed_sync(MIXED)
    shuffled_idx = list(reversed(range(len(MIXED))))
    shuffled = emb.embed_sync([MIXED[i] for i in shuffled_idx])[np.argsort(shuffled_idx)]
    padded = emb.embed_sync([*MIXED, "x " * 120])[: len(MIXED)]  # a long neighbour forces padding
    for other in (together, shuffled, padded):
        assert np.abs(alone - other).max() < 1e-5
    assert alone.dtype == np.float32
    assert np.allclose(np.linalg.norm(alone, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name", ["e5", "minilm"])
def test_a_text_read_first_is_embedded_from_the_same_ids(name: str, request: pytest.FixtureRequest) -> None:
    # can_read keeps the ids it found for the embedding that follows: they must be the ids a
    # fresh encoding gives, up to the longest readable text (one token more is not readable)
    emb: OnnxEmbedder = request.getfixturevalue(name)
    size = [len(emb.tokenizer.encode(emb.prefix + "a " * n, truncate=False).ids) for n in range(300)]
    longest = max(n for n, k in enumerate(size) if k <= emb.read.max_tokens)
    texts = [*MIXED, "a " * longest]
    fresh = emb.embed_sync(texts)
    assert [emb.can_read(t) for t in texts].count(True) >= len(texts) // 2
    assert emb.can_read(texts[-1]) and not emb.can_read("a " * (longest + 1))
    assert emb.embed_sync(texts).tolist() == fresh.tolist()
    assert emb.embed_sync(["a " * (longest + 1)]).shape == (1, emb.dim)  # read, refused, embedded anew


def test_minilm_cannot_read_chinese_and_would_be_fooled(minilm: OnnxEmbedder) -> None:
    # why can_read exists: under an English vocabulary "open" and "close" become the same [UNK]s
    v = minilm.embed_sync(["怎么开通花呗", "怎么关闭花呗"])
    assert float(v[0] @ v[1]) > 0.99
    assert not minilm.can_read("怎么开通花呗")
    assert not minilm.can_read("How do I pay with 花呗?")
    assert minilm.can_read("How do I reset my password?")
    assert minilm.can_read("Ist das Café geöffnet?")


def test_e5_reads_chinese_and_tells_open_from_close(e5: OnnxEmbedder) -> None:
    assert e5.can_read("怎么开通花呗")
    v = e5.embed_sync(["怎么开通花呗", "怎么关闭花呗"])
    assert float(v[0] @ v[1]) < 0.99


@pytest.mark.parametrize("name", ["e5", "minilm"])
@pytest.mark.parametrize("text", ["", "   ", "\n", "word " * 400])
def test_unreadable_text(name: str, text: str, request: pytest.FixtureRequest) -> None:
    emb: OnnxEmbedder = request.getfixturevalue(name)
    assert not emb.can_read(text)  # empty, or truncation would hide the tail


def test_unknown_tokens_make_text_unreadable(minilm: OnnxEmbedder) -> None:
    assert not minilm.can_read("status of my order 😀")


def test_scripts() -> None:
    assert script_of("a") == script_of("é") == script_of("Ａ") == "Latin"
    assert script_of("花") == "Han"
    assert script_of("か") == "Kana"
    assert script_of("한") == "Hangul"
    assert script_of("Ж") == "Cyrillic"


def test_letters_outside_the_scripts_a_model_reads() -> None:
    latin, han = frozenset({"Latin"}), frozenset({"Han"})
    assert letters_outside("Where is my order 42?", latin) == 0
    assert letters_outside("Where is my order 42?", han) == 14  # ASCII is not read by a Han model
    assert letters_outside("Привет, my order", latin) == 6
    assert letters_outside("我的订单 order", han | latin) == 0


@given(st.lists(st.integers(1, 300), max_size=80), st.integers(1, 16))
def test_plan_batches_covers_every_index_once(lengths: list[int], max_batch: int) -> None:
    plan = plan_batches(lengths, max_batch)
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= max_batch for b in plan)


def test_build_is_idempotent(model_dir: Path) -> None:
    assert build_e5(model_dir) is False
    assert build_minilm(model_dir) is False


def test_generic_onnx_loader(model_dir: Path) -> None:
    emb = load_embedder("onnx", model_dir / "minilm", pooling="mean", label="my-minilm", scripts=["Latin"])
    ref = load_embedder("minilm", model_dir)
    assert emb.name == "my-minilm" and emb.dim == 384
    assert np.abs(emb.embed_sync(["hello there"]) - ref.embed_sync(["hello there"])).max() < 1e-6
    with pytest.raises(ValueError):
        load_embedder("nope", model_dir)
    with pytest.raises(FileNotFoundError):
        load_embedder("minilm", model_dir / "missing")


@pytest.mark.parametrize("name", ["e5", "minilm"])
def test_token_states_ride_on_the_same_forward_pass(name: str, request: pytest.FixtureRequest) -> None:
    emb: OnnxEmbedder = request.getfixturevalue(name)
    texts = ["How do I reset my password?", "what is the capital of France", "x " * 30]
    vectors, states = emb.embed_with_states(texts)
    assert np.abs(vectors - emb.embed_sync(texts)).max() < 1e-5  # the same embeddings
    first = states[0]
    assert len(first.pieces) == first.vectors.shape[0] and first.vectors.shape[1] == emb.dim
    assert np.allclose(np.linalg.norm(first.vectors, axis=1), 1.0, atol=1e-4)
    joined = "".join(first.pieces).replace("▁", "").replace("##", "").lower()
    assert joined == "howdoiresetmypassword?"  # no [CLS]/[SEP], no "query: " prefix


def test_token_states_tell_a_synonym_from_a_change(e5: OnnxEmbedder) -> None:
    from extproc.dedup.align import alignment

    _, (a, syn, other) = e5.embed_with_states(
        [
            "How do I fix a broken screen?",
            "How do I repair a broken screen?",
            "How do I sell a broken screen?",
        ]
    )
    f_syn = alignment(a.pieces, a.vectors, syn.pieces, syn.vectors)
    f_other = alignment(a.pieces, a.vectors, other.pieces, other.vectors)
    assert f_syn[0] > f_other[0]  # BERTScore F: the synonym aligns better than the different action
