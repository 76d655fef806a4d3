"""The semantic half of a lookup: embed once, LSH buckets → candidates → exact cosine → decide.

The embedder, the policy (operating point per embedder and language) and `decide` come from
extproc.embed and extproc.dedup; this module only finds the best candidates and asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..dedup.decide import Decision, Policy, decide
from ..dedup.lang import language
from .lsh import Lsh, choose


class AsyncEmbedder(Protocol):
    name: str
    dim: int

    def can_read(self, text: str) -> bool: ...

    async def embed(self, text: str) -> np.ndarray: ...


Decide = Callable[[str, str, float, Policy], Decision]


def floor(policy: Policy) -> float | None:
    """The lowest cosine any enabled language accepts; None when no language is on."""
    floors = [p.min_cosine for p in policy.languages.values() if p.threshold is not None]
    return min(floors) if floors else None


@dataclass
class Matcher:
    embedder: AsyncEmbedder
    policy: Policy
    lsh: Lsh
    max_candidates: int = 128
    decide: Decide = decide

    @classmethod
    def create(
        cls, embedder: AsyncEmbedder, policy: Policy, *, rows: int | None = None, bands: int | None = None,
        recall: float = 0.995, seed: int = 0, max_candidates: int = 128, center: np.ndarray | None = None,
    ) -> Matcher | None:
        """None when the policy switches every language off: then nothing is ever embedded."""
        low = floor(policy)
        if low is None:
            return None
        auto_rows, auto_bands = choose(low, recall)
        lsh = Lsh.create(embedder.dim, rows or auto_rows, bands or auto_bands, seed, center, embedder.name)
        return cls(embedder, policy, lsh, max_candidates)

    def skip_reason(self, text: str) -> str | None:
        """Why this text must not take the semantic path (cheap checks, before any embedding)."""
        if not self.policy.enabled(language(text)):
            return "language_off"
        if not self.embedder.can_read(text):
            return "unreadable"
        return None

    def ranked(
        self, vector: np.ndarray, candidates: list[tuple[str, bytes]], keep: int = 3
    ) -> list[tuple[str, float]]:
        """The best `keep` candidates by exact cosine, at or above the policy's floor."""
        if not candidates:
            return []
        matrix = np.frombuffer(b"".join(v for _, v in candidates), dtype=np.float32)
        matrix = matrix.reshape(len(candidates), -1)
        if matrix.shape[1] != vector.shape[0]:
            return []  # vectors of another embedder: never comparable
        cosines = matrix @ vector.astype(np.float32)
        low = floor(self.policy) or 1.0
        order = np.argsort(-cosines)[:keep]
        return [(candidates[i][0], float(cosines[i])) for i in order if cosines[i] >= low]

    def same(self, query: str, candidate: str, cosine: float) -> Decision:
        return self.decide(query, candidate, cosine, self.policy)
