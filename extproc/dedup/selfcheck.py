"""Self-calibration decisions, pure: which bin a semantic candidate falls in, whether that bin
serves or learns, whether this candidate is checked, and whether two answers agree.

A bin is (tenant, language, verifier-score bin). Its evidence is the outcome of checks: a
candidate sent upstream anyway, the fresh answer compared with the cached one. A bin serves
only while the 95% Wilson lower bound of its precision is at or above the target on at
least ``min_checks`` checks; until then every candidate of the bin is checked (it costs what
a miss costs, nothing more), and once it serves, a ``share`` of its candidates still is. One
wrong check too many pulls the bound under the target and the bin stops serving at once.

A new deployment need not start from nothing. Where the shipped evaluation's selection pairs
that fall in a bin prove the target (their 95% lower bound reaches it on enough pairs), the
bin starts with a **prior**: those pairs discounted to just enough evidence to serve (the
fewest checks at their precision, wrong ones rounded up, whose bound still reaches the
target). It serves from its first candidate, and one wrong live answer before more agreeing
ones pull its bound under the target. A bin whose shipped pairs prove nothing starts empty.

Nothing here does I/O: the counts come from a store, the draw from an injected random source.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["serve", "learn"]
Action = Literal["serve", "check"]


def wilson_lower(successes: int, n: int, z: float = 1.959964) -> float:
    """Lower end of the 95% Wilson score interval of a proportion (0 for no trials)."""
    if n <= 0:
        return 0.0
    p = successes / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / (1 + z * z / n))


@dataclass(frozen=True)
class Counts:
    """Outcomes of one bin's checks."""

    checks: int = 0
    agreed: int = 0

    @property
    def precision(self) -> float:
        return self.agreed / self.checks if self.checks else 0.0

    @property
    def lower(self) -> float:
        return wilson_lower(self.agreed, self.checks)

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.checks + other.checks, self.agreed + other.agreed)


def prior(
    evidence: Sequence[tuple[float, int, int]], edges: Sequence[float], target: float, min_checks: int
) -> dict[str, Counts]:
    """The bins whose shipped evidence proves ``target``, each with its just-enough prior.
    ``evidence``: cumulative (threshold, pairs scored at or above it, of them the same
    question). A bin whose edges are not both thresholds of the evidence (or the top bin's
    lower edge) gets none."""
    at = {round(t, 4): (n, ok) for t, n, ok in evidence}
    out: dict[str, Counts] = {}
    for i, edge in enumerate(edges):
        low = at.get(round(edge, 4))
        high = at.get(round(edges[i + 1], 4)) if i + 1 < len(edges) else (0, 0)
        if low is None or high is None or low[0] <= high[0]:
            continue
        n, ok = low[0] - high[0], low[1] - high[1]
        for m in range(min(n, min_checks), n + 1):  # the fewest checks that still prove it
            wrong = math.ceil((n - ok) * m / n - 1e-9)
            if verdict(Counts(m, m - wrong), target, min_checks) == "serve":
                out[f"{edge:.2f}"] = Counts(m, m - wrong)
                break
    return out


def bin_of(score: float, edges: Sequence[float]) -> str | None:
    """The bin's name (its lower edge, two decimals) of a verifier score; None below the first
    edge, the floor under which a candidate is never considered. ``edges`` rise."""
    name = None
    for edge in edges:
        if score >= edge:
            name = f"{edge:.2f}"
    return name


def verdict(counts: Counts, target: float, min_checks: int) -> Verdict:
    return "serve" if counts.checks >= min_checks and counts.lower >= target else "learn"


def share_of(live: Counts, prior: Counts, share: float, warm_share: float, min_checks: int) -> float:
    """A bin that serves on its prior more than on live checks checks ``warm_share`` of its
    candidates until it has ``min_checks`` live checks, then ``share``."""
    return warm_share if prior.checks and live.checks < min_checks else share


def action(v: Verdict, share: float, draw: float) -> Action:
    """A learning bin checks every candidate; a serving bin checks when ``draw`` (uniform in
    [0, 1)) falls under ``share``."""
    return "check" if v == "learn" or draw < share else "serve"


_SPACE = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def normalise_answer(text: str) -> str:
    """Case, width, punctuation and spacing do not make two answers different."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _SPACE.sub(" ", _PUNCT.sub(" ", folded)).strip()


def same_text(a: str, b: str) -> bool:
    return normalise_answer(a) == normalise_answer(b)


def agree(cosine: float | None, threshold: float) -> bool:
    """Two answers whose normalised texts differ agree when their embeddings' cosine reaches
    ``threshold``; without a cosine (an answer the embedder cannot read) they do not."""
    return cosine is not None and cosine >= threshold
