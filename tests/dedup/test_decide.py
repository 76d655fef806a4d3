from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from extproc.dedup import decide, language, load_policy
from extproc.dedup.align import ALIGN_FEATURES
from extproc.dedup.decide import DEFAULT_TARGET, shipped_policy_file
from extproc.dedup.guards import guard, guard_verdict, numbers, swapped
from extproc.dedup.verifier import FEATURES, Verifier, features, fit

from .test_should_miss import NO_STATES, permissive


def test_near_exact_needs_no_model() -> None:
    d = decide("How do I reset my password?", "how do I reset  my password ？", 0.0, load_policy("minilm"))
    assert d.same and d.reason == "near-exact"


def test_language_mismatch_and_off_languages() -> None:
    assert decide("怎么还款", "how to repay", 1.0, permissive()).reason == "language"
    assert decide("Wie geht es?", "Wie geht's?", 1.0, permissive(), NO_STATES).reason.startswith(
        ("semantic", "guard")
    )
    assert decide("こんにちは元気", "こんにちは元気ですか", 1.0, permissive()).reason == "off:ja"


@pytest.mark.parametrize("embedder", ["e5-small", "minilm"])
def test_shipped_policy_meets_its_target_or_is_off(embedder: str) -> None:
    policy = load_policy(embedder)
    assert policy.target == DEFAULT_TARGET
    assert "zh" not in policy.languages or embedder == "e5-small"  # MiniLM cannot read Chinese
    for lang, point in policy.languages.items():
        if point.threshold is None:
            continue
        cp = point.chosen()
        assert cp is not None and cp.lower >= DEFAULT_TARGET and cp.hits >= 30, lang


def test_switching_a_language_off() -> None:
    policy = load_policy("e5-small", target=0.5, enable={"en": False})
    assert not policy.enabled("en")


def test_unknown_embedder_is_near_exact_only() -> None:
    policy = load_policy("some-operator-model")
    assert not policy.languages
    assert decide("a b", "a  b", 0.0, policy).same
    assert not decide("how do I pay", "how can I pay", 1.0, policy).same


def test_shipped_file_is_small_and_complete() -> None:
    path = shipped_policy_file()
    assert path.stat().st_size < 200_000
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert set(doc["embedders"]) == {"e5-small", "minilm"}
    assert set(doc["embedders"]["e5-small"]) == {"zh", "en"}


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("怎么开通花呗", "zh"),
        ("How are you", "en"),
        ("花呗 payment", "zh"),
        ("Привет", "other"),
        ("안녕하세요", "ko"),
        ("123 ?", ""),
    ],
)
def test_language(text: str, lang: str) -> None:
    assert language(text) == lang


def test_guard_table() -> None:
    assert guard("花呗怎么还款", "花呗如何还款") is None
    assert guard("verify the account", "rename the account") == "substitution"
    assert guard("refund my order", "refund my whole order") == "insertion"
    assert guard("refund my order", "refund my whole order", swaps=()) is None
    assert swapped("a b c d e f", "u v w x y z") is None  # a rewrite is the verifier's to judge
    assert numbers("我想借三千块") == numbers("I want to borrow 3000")


def test_verifier_fit_and_roundtrip() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(FEATURES)))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float64)
    v = fit(x, y)
    acc = ((np.asarray(v.score(x)) >= 0.5) == (y == 1)).mean()
    assert acc > 0.95
    assert Verifier.from_json(json.loads(json.dumps(v.to_json()))) == v
    assert set(v.explain(x[0])) == set(FEATURES)


def test_features_have_the_verifiers_shape() -> None:
    f = features("How do I reset my password?", "Reset password how", 0.9, np.zeros(len(ALIGN_FEATURES)))
    assert f.shape == (len(FEATURES),) and np.all(f >= 0)


def test_semantic_layer_without_token_states_says_no() -> None:
    d = decide("How do I reset my password?", "How can I reset the password?", 1.0, permissive())
    assert not d.same and d.reason == "no-states"


def test_equivalences_are_not_differences() -> None:
    for a, b in [
        ("How do I reset my password?", "How can I reset my password?"),  # auxiliary / modal
        ("What is the refund policy?", "What's the refund policy?"),  # contraction
        ("花呗怎么修改手机号", "花呗如何更改手机号"),  # synonyms
        ("退款要多久", "退款需要多长时间"),
        ("Where can I buy a gift card?", "Where can I purchase a gift card?"),
    ]:
        assert guard(a, b) is None, (a, b)


def test_polarity_and_direction_are_differences() -> None:
    assert guard("How do I enable dark mode?", "How do I disable dark mode?", ()) == "antonym"
    assert guard("怎么开通花呗", "怎么关闭花呗", ()) == "antonym"
    assert guard("从余额宝转到银行卡", "从银行卡转到余额宝要多久", ()) == "direction"
    assert (
        guard("Move money from savings to checking", "Move money from checking to savings", ()) == "direction"
    )
    assert guard("Can I cancel?", "Can't I cancel?", ()) == "negation"


def test_a_detail_added_in_a_rewrite_is_a_feature_a_value_replaced_is_a_veto() -> None:
    # a rewrite mentioning a number the other lacks: left to the verifier, counted as a difference
    assert guard_verdict(
        "Two people are sailing a small white boat across the bay.", "A couple sails in a sailboat.", ()
    ) == (None, 1)
    assert guard("Book a table for 2 people", "Book a table for 4 people", ()) == "number"
    assert guard("Book a table", "Book a table for 4 people", ()) == "number"  # small edit: veto


def test_policy_file_argument(tmp_path: Path) -> None:
    src = json.loads(shipped_policy_file().read_text(encoding="utf-8"))
    (tmp_path / "p.json").write_text(json.dumps(src), encoding="utf-8")
    assert load_policy("e5-small", path=tmp_path / "p.json").embedder == "e5-small"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Question number 2 about billing", "Question number 1 about billing"),
        ("What is in chapter 1?", "What is in chapter 3?"),
        ("第1章讲了什么", "第2章讲了什么"),
    ],
)
def test_a_digit_one_is_a_number_that_differs(a: str, b: str) -> None:
    """"One" in words is the article ("一个人", "one of"); the digit 1 is a value like any other."""
    assert guard(a, b) == "number" and guard(b, a) == "number"
