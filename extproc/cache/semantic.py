"""The semantic half of a lookup: embed once, LSH buckets → candidates → exact cosine → decide.

The embedder, the policy (operating point per embedder and language) and `decide` come from
extproc.embed and extproc.dedup; this module only finds the best candidates and asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..dedup.align import alignment
from ..dedup.decide import Decision, Policy, decide
from ..dedup.judge import Judge, judge_features
from ..dedup.lang import language
from ..embed.token_states import TokenStates, TokenStatesCache
from .lsh import Lsh, choose


class AsyncEmbedder(Protocol):
    name: str
    dim: int

    def can_read(self, text: str) -> bool: ...

    async def embed(self, text: str, meanwhile: Callable[[], object] | None = None) -> np.ndarray: ...


Decide = Callable[..., Decision]  # (query, candidate, cosine, policy[, align[, judged]]) -> Decision


def states_cache(embedder: object) -> TokenStatesCache | None:
    """Where the matcher finds token states: the cache a batching embedder fills as it embeds,
    or, for a bare embedder (offline tools), a new one read into on demand. None: this
    embedder's graph gives no token states, and the semantic layer says no past the guards."""
    cache = getattr(embedder, "states", None)
    if isinstance(cache, TokenStatesCache):
        return cache
    if getattr(embedder, "reads_states", False) and callable(getattr(embedder, "embed_with_states", None)):
        return TokenStatesCache()
    return None


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
    tokens: TokenStatesCache | None = field(default=None)
    judge: Judge | None = None  # scores the pairs past the guards when the policy's scorer is "judge"

    @classmethod
    def create(
        cls,
        embedder: AsyncEmbedder,
        policy: Policy,
        *,
        rows: int | None = None,
        bands: int | None = None,
        recall: float = 0.995,
        seed: int = 0,
        max_candidates: int = 128,
        center: np.ndarray | None = None,
        judge: Judge | None = None,
    ) -> Matcher | None:
        """None when the policy switches every language off: then nothing is ever embedded."""
        low = floor(policy)
        if low is None:
            return None
        auto_rows, auto_bands = choose(low, recall)
        lsh = Lsh.create(embedder.dim, rows or auto_rows, bands or auto_bands, seed, center, embedder.name)
        return cls(embedder, policy, lsh, max_candidates, tokens=states_cache(embedder), judge=judge)

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

    async def warm(self, texts: Sequence[str]) -> None:
        """Token states for a query (``texts[0]``) and its candidates, when a decision will need
        them (past near-exact, language and guards). The query's came with its embedding; a
        candidate this process embedded is still cached; any other is embedded once more,
        batched with the other streams' texts, and kept. A read that is shed or fails leaves
        the states missing, and ``same`` says no."""
        tokens = self.tokens
        if tokens is None or len(texts) < 2:
            return
        missing = [t for t in dict.fromkeys(texts) if t not in tokens]
        if not missing or not any(self._needs_states(texts[0], c) for c in texts[1:]):
            return
        tokens.reads += len(missing)
        embed = getattr(self.embedder, "embed", None)
        if embed is not None and not hasattr(self.embedder, "embed_with_states"):
            await asyncio.gather(*(embed(t) for t in missing), return_exceptions=True)
        else:  # a bare embedder: read here, off the event loop
            await asyncio.to_thread(self._read, missing)

    def same(self, query: str, candidate: str, cosine: float) -> Decision:
        if self.tokens is None:
            return self.decide(query, candidate, cosine, self.policy)
        return self.decide(
            query,
            candidate,
            cosine,
            self.policy,
            lambda: self._alignment(query, candidate),
            lambda: self._judged(query, candidate, cosine),
        )

    def _needs_states(self, query: str, candidate: str) -> bool:
        """Whether deciding this pair reaches the verifier or the judge (the guards veto most
        pairs first)."""
        asked: list[bool] = []

        def ask() -> None:
            asked.append(True)

        self.decide(query, candidate, 1.0, self.policy, ask, ask)
        return bool(asked)

    def _judged(self, query: str, candidate: str, cosine: float) -> float | None:
        """The judge's score of the pair; None without a judge or without both token states."""
        if self.judge is None:
            return None
        a, b = self._states(query), self._states(candidate)
        if a is None or b is None:
            return None
        align = alignment(a.pieces, a.vectors, b.pieces, b.vectors)
        return self.judge.score(a.vectors, b.vectors, judge_features(query, candidate, cosine, align))

    def _alignment(self, query: str, candidate: str) -> np.ndarray | None:
        a, b = self._states(query), self._states(candidate)
        if a is None or b is None:
            return None
        return alignment(a.pieces, a.vectors, b.pieces, b.vectors)

    def _states(self, text: str) -> TokenStates | None:
        assert self.tokens is not None
        found = self.tokens.get(text)
        if found is None and hasattr(self.embedder, "embed_with_states"):  # a bare embedder: read inline
            self.tokens.reads += 1
            self._read([text])
            found = self.tokens.get(text)
        return found

    def _read(self, texts: list[str]) -> None:
        assert self.tokens is not None
        _, states = self.embedder.embed_with_states(texts)  # type: ignore[attr-defined]
        for text, st in zip(texts, states, strict=True):
            self.tokens.put(text, st)
