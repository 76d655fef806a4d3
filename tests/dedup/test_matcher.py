"""The semantic matcher feeds the verifier token states read from the same model."""

from __future__ import annotations

import numpy as np

from extproc.cache.semantic import Matcher
from extproc.dedup import load_policy
from extproc.embed import OnnxEmbedder


def test_matcher_reads_token_states_once_per_text(e5: OnnxEmbedder) -> None:
    m = Matcher.create(e5, load_policy(e5.name))  # type: ignore[arg-type]  # only dim/name/token_reader used
    assert m is not None and m.tokens is not None
    q, para, other = (
        "How do I reset my password?",
        "How can I reset my password?",
        "How do I sell my password?",
    )
    v = e5.embed_sync([q, para, other])
    d = m.same(para, q, float(v[1] @ v[0]))
    assert d.same and d.reason == "semantic"
    assert not m.same(other, q, float(v[2] @ v[0])).same
    assert m.tokens.reads == 3  # the query's states were read once and reused


def test_without_a_token_reader_the_semantic_layer_says_no(e5: OnnxEmbedder) -> None:
    class Plain:
        name, dim = e5.name, e5.dim

    m = Matcher.create(Plain(), load_policy(e5.name))  # type: ignore[arg-type]
    assert m is not None and m.tokens is None
    v = e5.embed_sync(["How do I reset my password?", "How can I reset my password?"])
    d = m.same("How can I reset my password?", "How do I reset my password?", float(np.dot(v[0], v[1])))
    assert not d.same and d.reason == "no-states"
    assert m.same("How do I reset my password", "how do I reset my password?", 0.0).reason == "near-exact"
