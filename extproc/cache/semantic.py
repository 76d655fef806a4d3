"""The semantic half of a lookup: embed once, LSH buckets → candidates → exact cosine → decide.

The embedder, the policy (operating point per embedder and language) and `decide` come from
extproc.embed and extproc.dedup; this module only finds the best candidates and asks.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..dedup.align import alignment
from ..dedup.decide import Decision, Policy, decide
from ..dedup.lang import language
from .lsh import Lsh, choose


class AsyncEmbedder(Protocol):
    name: str
    dim: int

    def can_read(self, text: str) -> bool: ...

    async def embed(self, text: str) -> np.ndarray: ...


Decide = Callable[..., Decision]  # (query, candidate, cosine, policy[, align]) -> Decision
States = tuple[tuple[str, ...], np.ndarray]


class TokenReader(Protocol):
    def read(self, texts: list[str]) -> tuple[np.ndarray, Sequence[object]]: ...


class TokenStatesCache:
    """Token states per text (for the verifier's alignment features), least recently used out.

    ``OnnxEmbedder.token_reader()`` runs the embedder's graph with its hidden state exposed; a
    text read once (the query, a cached prompt) is not read again while it stays in the cache.
    """

    def __init__(self, reader: TokenReader, size: int = 4096) -> None:
        self.reader = reader
        self.size = size
        self._lru: OrderedDict[str, States] = OrderedDict()
        self.reads = 0

    def get(self, text: str) -> States:
        hit = self._lru.get(text)
        if hit is None:
            self.warm_sync([text])
            hit = self._lru[text]
        self._lru.move_to_end(text)
        return hit

    def warm_sync(self, texts: Sequence[str]) -> None:
        todo = [t for t in dict.fromkeys(texts) if t not in self._lru]
        if not todo:
            return
        self.reads += len(todo)
        _, states = self.reader.read(todo)
        for t, st in zip(todo, states, strict=True):
            self._lru[t] = (tuple(st.pieces), st.vectors)  # type: ignore[attr-defined]
        while len(self._lru) > self.size:
            self._lru.popitem(last=False)

    async def warm(self, texts: Sequence[str]) -> None:
        """Read the texts not yet cached, off the event loop."""
        if any(t not in self._lru for t in texts):
            await asyncio.to_thread(self.warm_sync, list(texts))


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
    ) -> Matcher | None:
        """None when the policy switches every language off: then nothing is ever embedded."""
        low = floor(policy)
        if low is None:
            return None
        auto_rows, auto_bands = choose(low, recall)
        lsh = Lsh.create(embedder.dim, rows or auto_rows, bands or auto_bands, seed, center, embedder.name)
        inner = getattr(embedder, "inner", embedder)  # a BatchingEmbedder wraps the model's embedder
        reader = getattr(inner, "token_reader", None)
        tokens = TokenStatesCache(reader()) if callable(reader) else None
        return cls(embedder, policy, lsh, max_candidates, tokens=tokens)

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
        """Optional: read token states for the query and its candidates off the event loop
        before ``same`` (which otherwise reads any missing ones inline)."""
        if self.tokens is not None:
            await self.tokens.warm(texts)

    def same(self, query: str, candidate: str, cosine: float) -> Decision:
        if self.tokens is None:
            return self.decide(query, candidate, cosine, self.policy)
        point = self.policy.languages.get(language(query))
        if point is None or point.threshold is None or cosine < point.min_cosine:
            return self.decide(query, candidate, cosine, self.policy)  # no verifier: no states needed
        pa, sa = self.tokens.get(query)
        pb, sb = self.tokens.get(candidate)
        return self.decide(query, candidate, cosine, self.policy, alignment(pa, sa, pb, sb))
