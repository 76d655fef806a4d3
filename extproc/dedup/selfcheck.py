"""Self-calibration decisions, pure: which bin a semantic candidate falls in, whether that bin
serves or learns, whether this candidate is checked, and whether two answers agree.

A bin is (tenant, language, verifier-score bin). Its evidence is the outcome of checks: a
candidate sent upstream anyway, the fresh answer compared with the cached one. A bin serves
only while the 95% Wilson lower bound of its precision is at or above the target on at
least ``min_checks`` checks; until then every candidate of the bin is checked (it costs what
a miss costs, nothing more), and once it serves, a ``share`` of its candidates still is. One
wrong check too many pulls the bound under the target and the bin stops serving at once.

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
