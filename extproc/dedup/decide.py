"""``decide(query, candidate, cosine, policy)``: is the cached candidate the same question?

Layers, cheapest and safest first: canonical text equal (near-exact, no model involved);
then, only for a language whose operating point reached the precision target (on the 95%
lower bound, with enough hits), the semantic layer: cosine floor, guards (a hard veto for
polarity, direction, ids, amounts, and any value changed in an otherwise identical prompt;
a detail only one side of a rewrite mentions is a scored feature), then the fitted verifier
over lexical and token-alignment features (``align`` from the embedder's token states), or,
when the policy says so, the trained pair judge (``judged``: its score, see ``judge``).
The caller checks ``Embedder.can_read`` before it embeds; unreadable text never gets here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np

from .canonical import canonical
from .guards import guard
from .lang import language
from .verifier import Verifier, features

DEFAULT_TARGET = 0.95
DEFAULT_MIN_HITS = 30  # an operating point resting on fewer selection hits is not trusted


@dataclass(frozen=True)
class Decision:
    same: bool
    # near-exact | semantic | off:<lang> | language | cosine | guard:<name> | no-states | verifier | judge
    reason: str
    score: float


@dataclass(frozen=True)
class CurvePoint:
    threshold: float  # on the verifier score
    precision: float  # on the selection pairs (its lower bound chooses the point)
    recall: float
    test_precision: float  # on the held-out test pairs (reported)
    test_recall: float
    test_hits: int
    lower: float = 0.0  # 95% Wilson lower bound of the selection precision
    hits: int = 0  # selection hits
    test_lower: float = 0.0


@dataclass(frozen=True)
class LanguagePoint:
    """A language's semantic settings for one embedder, and the measured curve behind them."""

    min_cosine: float
    verifier: Verifier
    curve: tuple[CurvePoint, ...] = ()
    threshold: float | None = None  # None: semantic matching off for this language
    swaps: tuple[str, ...] = ("substitution", "insertion")
    vetoes: tuple[str, ...] | None = None  # the guards that veto here (None: all of them)

    def at(self, target: float, min_hits: int = DEFAULT_MIN_HITS) -> LanguagePoint:
        """The loosest threshold whose selection precision has a 95% lower bound at or above
        ``target`` on at least ``min_hits`` hits (the test pairs only report it)."""
        ok = [p for p in self.curve if p.lower >= target and p.hits >= min_hits]
        best = min(ok, key=lambda p: p.threshold, default=None)
        return replace(self, threshold=None if best is None else best.threshold)

    def chosen(self) -> CurvePoint | None:
        return next((c for c in self.curve if c.threshold == self.threshold), None)


@dataclass(frozen=True)
class Policy:
    embedder: str
    target: float = DEFAULT_TARGET
    languages: dict[str, LanguagePoint] = field(default_factory=dict)
    scorer: str = "verifier"  # verifier | judge: what scores a pair past the guards

    def enabled(self, lang: str) -> bool:
        point = self.languages.get(lang)
        return point is not None and point.threshold is not None


Align = np.ndarray | Callable[[], np.ndarray | None]
Judged = Callable[[], float | None]


def decide(
    query: str,
    candidate: str,
    cosine: float,
    policy: Policy,
    align: Align | None = None,
    judged: Judged | None = None,
) -> Decision:
    """``align``: :func:`extproc.dedup.align.alignment` of the two prompts' token states, or a
    function that gives it, called only for a pair that reaches the verifier (most pairs are
    settled before: their states are never needed); without it the semantic layer cannot
    score the pair and says no. ``judged``: for a policy whose scorer is the judge, a function
    that gives the judge's score of the pair (None: no token states), called only past the
    guards."""
    if canonical(query) == canonical(candidate):
        return Decision(True, "near-exact", 1.0)
    lang = language(query)
    if language(candidate) != lang:
        return Decision(False, "language", 0.0)
    point = policy.languages.get(lang)
    if point is None or point.threshold is None:
        return Decision(False, f"off:{lang or 'none'}", 0.0)
    if cosine < point.min_cosine:
        return Decision(False, "cosine", 0.0)
    vetoed = guard(query, candidate, point.swaps, point.vetoes)
    if vetoed is not None:
        return Decision(False, f"guard:{vetoed}", 0.0)
    if policy.scorer == "judge":
        score_j = judged() if judged is not None else None
        if score_j is None:
            return Decision(False, "no-states", 0.0)
        ok = score_j >= point.threshold
        return Decision(ok, "semantic" if ok else "judge", float(score_j))
    if callable(align):
        align = align()
    if align is None:
        return Decision(False, "no-states", 0.0)
    score = float(point.verifier.score(features(query, candidate, cosine, align)))
    return Decision(score >= point.threshold, "semantic" if score >= point.threshold else "verifier", score)


# ----------------------------------------------------------------------------- persistence


def shipped_policy_file() -> Path:
    return Path(str(resources.files("extproc.dedup") / "verifier.json"))


def policy_from_json(data: dict[str, object], embedder: str, target: float = DEFAULT_TARGET) -> Policy:
    models = data["embedders"]
    assert isinstance(models, dict)
    if embedder not in models:
        return Policy(embedder, target)  # unknown embedder: near-exact only
    langs: dict[str, LanguagePoint] = {}
    for lang, d in models[embedder].items():
        curve = tuple(CurvePoint(**p) for p in d["curve"])
        point = LanguagePoint(
            float(d["min_cosine"]),
            Verifier.from_json(d["verifier"]),
            curve,
            swaps=tuple(d.get("swaps", ("substitution", "insertion"))),
        )
        langs[lang] = point.at(target, int(data.get("min_hits", DEFAULT_MIN_HITS)))  # type: ignore[call-overload]
    return Policy(embedder, target, langs)


def load_policy(
    embedder: str,
    target: float = DEFAULT_TARGET,
    path: Path | None = None,
    enable: dict[str, bool] | None = None,
) -> Policy:
    """The shipped (or an operator's calibrated) policy; ``enable`` may switch a language off."""
    data = json.loads((path or shipped_policy_file()).read_text(encoding="utf-8"))
    policy = policy_from_json(data, embedder, target)
    for lang, on in (enable or {}).items():
        if not on and lang in policy.languages:
            policy.languages[lang] = replace(policy.languages[lang], threshold=None)
    return policy
