"""Pairs that ask different questions: none may be judged the same, whatever the cosine says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from extproc.dedup import Decision, LanguagePoint, Policy, canonical, decide, load_policy
from extproc.dedup.align import ALIGN_FEATURES, alignment
from extproc.dedup.calibrate import SWAPS
from extproc.dedup.verifier import FEATURES, Verifier
from extproc.embed import OnnxEmbedder

SETS = Path(__file__).parent / "data"


def read_set(name: str) -> list[tuple[str, str, str, str]]:
    rows = (SETS / name).read_text(encoding="utf-8").splitlines()
    return [(r[0], r[1], r[2], r[3]) for r in (line.split("\t") for line in rows)]


SHOULD_MISS = read_set("should_miss.tsv")
SHOULD_HIT = read_set("should_hit.tsv")
NO_STATES = np.zeros(len(ALIGN_FEATURES))


def test_the_sets_are_big_enough_and_cover_both_languages() -> None:
    assert len(SHOULD_MISS) >= 300 and len(SHOULD_HIT) >= 300
    assert {lang for lang, *_ in SHOULD_MISS} == {lang for lang, *_ in SHOULD_HIT} == {"en", "zh"}
    kinds = {k for _, k, _, _ in SHOULD_MISS}
    assert {"negation", "antonym", "direction", "number", "date", "amount", "id", "entity", "action"} <= kinds


def test_the_committed_sets_are_what_the_generator_writes() -> None:
    from .data.make_pairs import should_hit, should_miss

    assert should_miss() == SHOULD_MISS and should_hit() == SHOULD_HIT


def permissive(embedder: str = "any") -> Policy:
    """Semantic layer on, every cosine and every verifier score accepted: only the guards stand
    (with each language's shipped choice of which small edits are vetoes)."""
    v = Verifier(
        tuple(0.0 for _ in FEATURES), 0.0, tuple(0.0 for _ in FEATURES), tuple(1.0 for _ in FEATURES)
    )
    langs = {
        lang: LanguagePoint(min_cosine=0.0, verifier=v, threshold=0.0, swaps=SWAPS[lang]) for lang in SWAPS
    }
    return Policy(embedder, 0.95, langs)


@pytest.mark.parametrize(
    ("lang", "kind", "a", "b"), SHOULD_MISS, ids=[f"{k}:{a}" for _, k, a, _ in SHOULD_MISS]
)
def test_guards_refuse_even_at_cosine_one(lang: str, kind: str, a: str, b: str) -> None:
    assert canonical(a) != canonical(b)  # never near-exact
    for q, c in ((a, b), (b, a)):
        d = decide(q, c, 1.0, permissive(), NO_STATES)
        assert not d.same, (kind, q, c, d)
        assert d.reason.startswith("guard:"), d


def _judge(emb: OnnxEmbedder, policy: Policy, a: str, b: str) -> Decision:
    (va, vb), (sa, sb) = emb.embed_with_states([a, b])
    return decide(
        a, b, float(np.dot(va, vb)), policy, alignment(sa.pieces, sa.vectors, sb.pieces, sb.vectors)
    )


@pytest.mark.parametrize("target", [0.95, 0.8])
def test_no_should_miss_pair_is_served_with_real_embeddings(e5: OnnxEmbedder, target: float) -> None:
    # zh and en on e5-small (it reads both), at the shipped target and at a much looser one
    policy = load_policy(e5.name, target)
    served = [(k, a, b) for _, k, a, b in SHOULD_MISS if _judge(e5, policy, a, b).same]
    assert served == []


def test_should_hit_recall_at_the_shipped_defaults(e5: OnnxEmbedder, minilm: OnnxEmbedder) -> None:
    hits = 0
    for lang, _, a, b in SHOULD_HIT:
        emb = e5 if lang == "zh" else minilm  # the gate's defaults: minilm, Chinese tenants on e5-small
        hits += _judge(emb, load_policy(emb.name), a, b).same
    assert hits / len(SHOULD_HIT) >= 0.8


def test_paraphrases_pass_the_guards() -> None:
    # the guards alone must not refuse everything: these reach the verifier
    for a, b in [
        ("How do I reset my password?", "how can i reset my password please"),
        ("花呗怎么还款", "花呗如何还款啊"),
        ("What's the refund policy?", "What is your policy on refunds?"),
    ]:
        assert decide(a, b, 1.0, permissive(), NO_STATES).reason in ("semantic", "near-exact")
