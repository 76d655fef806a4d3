from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from extproc.dedup import decide, language, load_policy
from extproc.dedup.decide import DEFAULT_TARGET, shipped_policy_file
from extproc.dedup.guards import guard, numbers, swapped
from extproc.dedup.verifier import FEATURES, Verifier, features, fit

from .test_should_miss import permissive


def test_near_exact_needs_no_model() -> None:
    d = decide("How do I reset my password?", "how do I reset  my password ？", 0.0, load_policy("minilm"))
    assert d.same and d.reason == "near-exact"


def test_language_mismatch_and_off_languages() -> None:
    assert decide("怎么还款", "how to repay", 1.0, permissive()).reason == "language"
    assert decide("Wie geht es?", "Wie geht's?", 1.0, permissive()).reason.startswith(("semantic", "guard"))
    assert decide("こんにちは元気", "こんにちは元気ですか", 1.0, permissive()).reason == "off:ja"


@pytest.mark.parametrize("embedder", ["e5-small", "minilm"])
def test_shipped_policy_meets_its_target_or_is_off(embedder: str) -> None:
    policy = load_policy(embedder)
    assert policy.target == DEFAULT_TARGET
    assert "zh" not in policy.languages or embedder == "e5-small"  # MiniLM cannot read Chinese
    for lang, point in policy.languages.items():
        if point.threshold is None:
            continue
        cp = next(c for c in point.curve if c.threshold == point.threshold)
        assert cp.precision >= DEFAULT_TARGET and cp.test_precision >= DEFAULT_TARGET, lang


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
    assert guard("open the account", "close the account") == "substitution"
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


def test_features_are_bounded() -> None:
    f = features("How do I reset my password?", "Reset password how", 0.9)
    assert f.shape == (len(FEATURES),) and np.all((f >= 0) & (f <= 1))


def test_policy_file_argument(tmp_path: Path) -> None:
    src = json.loads(shipped_policy_file().read_text(encoding="utf-8"))
    (tmp_path / "p.json").write_text(json.dumps(src), encoding="utf-8")
    assert load_policy("e5-small", path=tmp_path / "p.json").embedder == "e5-small"
