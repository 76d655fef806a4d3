"""The semantic matcher feeds the verifier token states from the embedding's own forward pass."""

from __future__ import annotations

import numpy as np
import pytest

from extproc.cache.semantic import Matcher
from extproc.dedup import load_policy
from extproc.dedup.align import alignment
from extproc.dedup.decide import Decision, decide
from extproc.embed import BatchingEmbedder, OnnxEmbedder

Q, PARA, OTHER = "How do I reset my password?", "How can I reset my password?", "How do I sell my password?"


def reference(e5: OnnxEmbedder, query: str, candidate: str) -> Decision:
    """The decision from a fresh read of both texts, as calibration computes it."""
    (vq, vc), (sq, sc) = e5.embed_with_states([query, candidate])
    align = alignment(sq.pieces, sq.vectors, sc.pieces, sc.vectors)
    return decide(query, candidate, float(vq @ vc), load_policy(e5.name), align)


async def test_a_prompt_this_process_embedded_needs_no_second_model_run(e5: OnnxEmbedder) -> None:
    emb = BatchingEmbedder(e5, workers=1)
    m = Matcher.create(emb, load_policy(e5.name))
    assert m is not None and m.tokens is emb.states and m.tokens is not None
    try:
        cached = await emb.embed(Q)  # an earlier miss, stored
        vector = await emb.embed(PARA)  # this request's query
        await m.warm([PARA, Q])
        d = m.same(PARA, Q, float(vector @ cached))
    finally:
        await emb.aclose()
    assert d.same and d.reason == "semantic"
    assert emb.stats.texts == 2 and m.tokens.reads == 0  # one model run per text, states included
    ref = reference(e5, PARA, Q)
    assert (d.same, d.reason) == (ref.same, ref.reason)  # the decision a fresh read gives
    assert d.score == pytest.approx(ref.score, abs=1e-4)


async def test_a_candidate_from_another_process_is_read_once_through_the_queue(e5: OnnxEmbedder) -> None:
    emb = BatchingEmbedder(e5, workers=1)
    m = Matcher.create(emb, load_policy(e5.name))
    assert m is not None and m.tokens is not None
    try:
        vector = await emb.embed(PARA)
        cosine = float(vector @ e5.embed_sync([Q])[0])
        await m.warm([PARA, Q])  # Q was embedded elsewhere: its states are read here, once
        first = m.same(PARA, Q, cosine)
        await m.warm([PARA, Q])
        again = m.same(PARA, Q, cosine)
    finally:
        await emb.aclose()
    assert first.same and first == again
    assert m.tokens.reads == 1 and emb.stats.texts == 2


async def test_a_pair_the_guards_veto_never_reads_states(e5: OnnxEmbedder) -> None:
    emb = BatchingEmbedder(e5, workers=1)
    m = Matcher.create(emb, load_policy(e5.name, 0.8))
    assert m is not None and m.tokens is not None
    query, candidate = "How do I reset my password on 3 May?", "How do I reset my password on 4 May?"
    try:
        vector = await emb.embed(query)
        await m.warm([query, candidate])
        d = m.same(query, candidate, float(vector @ e5.embed_sync([candidate])[0]))
    finally:
        await emb.aclose()
    assert not d.same and d.reason.startswith("guard:")
    assert m.tokens.reads == 0 and candidate not in m.tokens and emb.stats.texts == 1


async def test_states_that_could_not_be_read_make_the_answer_no(e5: OnnxEmbedder) -> None:
    emb = BatchingEmbedder(e5, workers=1)
    m = Matcher.create(emb, load_policy(e5.name))
    assert m is not None
    try:
        vector = await emb.embed(PARA)
        d = m.same(PARA, Q, float(vector @ e5.embed_sync([Q])[0]))  # no warm: Q's states never read
    finally:
        await emb.aclose()
    assert not d.same and d.reason == "no-states"


def test_a_bare_embedder_reads_each_text_once(e5: OnnxEmbedder) -> None:
    m = Matcher.create(e5, load_policy(e5.name))  # type: ignore[arg-type]  # offline tools: no batching
    assert m is not None and m.tokens is not None
    v = e5.embed_sync([Q, PARA, OTHER])
    d = m.same(PARA, Q, float(v[1] @ v[0]))
    assert d.same and d.reason == "semantic"
    assert not m.same(OTHER, Q, float(v[2] @ v[0])).same  # a swapped action: the guards say no
    assert m.tokens.reads == 2  # the query's states were read once and reused; OTHER's never


def test_without_token_states_the_semantic_layer_says_no(e5: OnnxEmbedder) -> None:
    class Plain:
        name, dim = e5.name, e5.dim

    m = Matcher.create(Plain(), load_policy(e5.name))  # type: ignore[arg-type]
    assert m is not None and m.tokens is None
    v = e5.embed_sync([Q, PARA])
    d = m.same(PARA, Q, float(np.dot(v[0], v[1])))
    assert not d.same and d.reason == "no-states"
    assert m.same("How do I reset my password", "how do I reset my password?", 0.0).reason == "near-exact"
