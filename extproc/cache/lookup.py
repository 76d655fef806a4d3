"""Finding a request's answer, cheapest first: the exact key (the process's hot copy, else one
store call that also elects the leader of an identical burst), then by meaning (one
embedding, the LSH candidates, the pair decision) and, for a paraphrase still in flight,
a wait for its answer.

One result per request: `Found` (the entry, decoded once), None (a miss: the request goes
upstream, leading its key when it holds the lease), or `StoreDownError`, raised once, when a
store call failed or ran over its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from ..dedup.guards import read_ahead
from ..embed.batching import EmbedShedError
from ..exchange import EMBEDDED, Exchange
from .backing import Backing, StoreDownError
from .entry import Entry
from .flight import Flight
from .keeper import CHECK, Keeper
from .keys import normalise
from .semantic import Matcher
from .setup import Matchers
from .store import Pending

Kind = Literal["exact", "near", "semantic"]


@dataclass(frozen=True)
class Found:
    entry: Entry
    key: str  # where it is stored (the source's key, for a paraphrase)
    result: Literal["hit", "coalesced"]  # coalesced: it waited for another request's answer
    kind: Kind
    similarity: float = 1.0


class Finder:
    def __init__(
        self, backing: Backing, keeper: Keeper, matchers: Matchers, may_wait_s: Callable[[Exchange], float]
    ) -> None:
        self.b = backing
        self.keeper = keeper  # a paraphrase's answer is kept under its own key too
        self.matchers = matchers
        # How long a request may wait for a slot (its admission deadline): a follower waits no longer.
        self.may_wait_s = may_wait_s

    async def find(self, ex: Exchange, f: Flight) -> Found | None:
        if f.access.lookup:
            found = await self._exact(ex, f)
            if found is not None:
                return found
        return await self._semantic(ex, f)

    async def gave_up_ms(self, f: Flight) -> int | None:
        """How long the last attempt at this key ran before its client gave up, if noted."""
        return await self.b.call(self.b.store.abandoned(f.q.scope, f.key), "abandoned")

    def announce(self, f: Flight) -> None:
        """A leader with a vector: paraphrases arriving while the model runs may wait for it."""
        c = self.b.config
        if not c.semantic.join_in_flight or self.b.tasks is None:
            return
        if f.token is None or f.vector is None or not f.bands or f.q.text is None:
            return
        item = Pending(f.q.scope, f.key, f.q.text, f.vector.astype("float32").tobytes(), f.bands,
                       int(c.coalesce.max_wait_s * 1000))
        self.b.tasks.spawn(self._pend(item), "cache_pend")

    async def _pend(self, item: Pending) -> None:
        # The store's call is made here, not before the task starts: a task cancelled before
        # its first step (at shutdown) would leave that coroutine never awaited.
        await self.b.guard.run(self.b.store.pend(item), None, "cache_pend", self.b.op_timeout_s)

    # ---------------------------------------------------------------- exact

    async def _exact(self, ex: Exchange, f: Flight) -> Found | None:
        hot = self.b.hot.get(f"{f.q.scope}.{f.key}") if self.b.hot is not None else None
        if hot is not None:
            self.b.metrics.cache_local_hits.inc()
            return self._by_key(f, hot, "hit")
        c = self.b.config.coalesce
        started = self.b.clock()
        claim = await self.b.leases.claim(
            f.q.scope, f.key, lead=c.enabled and f.access.store, wait_s=min(c.max_wait_s, self.may_wait_s(ex))
        )
        if claim.coalesced:
            ex.waited_s += self.b.clock() - started
        if claim.role == "unavailable":
            raise StoreDownError("lookup")
        if claim.role == "leader":
            f.token = claim.token
        entry = _load(claim.entry) if claim.role == "hit" and claim.entry is not None else None
        if entry is None or claim.entry is None:
            return None
        self.b.keep_hot(f.q.scope, f.key, entry, len(claim.entry))
        return self._by_key(f, entry, "coalesced" if claim.coalesced else "hit")

    def _by_key(self, f: Flight, entry: Entry, result: Literal["hit", "coalesced"]) -> Found:
        """An entry under the request's own exact key: its answer, a near-exact one, or a
        paraphrase's alias."""
        if entry.source:
            return Found(entry, entry.source, result, "semantic", entry.similarity)
        exact = f.q.text is None or normalise(entry.text) == normalise(f.q.text)
        return Found(entry, f.key, result, "exact" if exact else "near")

    # ---------------------------------------------------------------- by meaning

    async def _semantic(self, ex: Exchange, f: Flight) -> Found | None:
        m, text = self.matchers.for_request(ex.tenant, ex.route_path), f.q.text
        if m is None or text is None or not await self._embed(ex, f, m, text) or not f.access.lookup:
            return None
        nearest = await self._nearest(f, m)
        if nearest is None:
            return None
        key, cosine, entry, other = nearest
        await m.warm([text, other])  # token states for the verifier, off the event loop
        decision = m.same(text, other, cosine)
        if not decision.same:
            return None
        if self.b.selfcheck is not None and decision.reason == "semantic":
            # A flight in a bin that is not serving goes upstream unjoined (nothing to compare yet).
            check = await self.b.selfcheck.judge(ex.tenant, text, entry, decision.score, m)
            if check is not None:  # upstream: served fresh, compared with `entry` once complete
                ex.state[CHECK] = check
                return None
        kind: Kind = "near" if decision.reason == "near-exact" else "semantic"
        if entry is None:
            return await self._join(ex, f, key, cosine, kind)
        await self.keeper.alias(f, entry, key, cosine)
        return Found(entry, key, "hit", kind, cosine)

    async def _embed(self, ex: Exchange, f: Flight, m: Matcher, text: str) -> bool:
        """The request's vector and LSH bands; False (counted) when it has none in time."""
        skip = m.skip_reason(text)
        if skip is not None:
            self.b.metrics.cache_semantic_skips.labels(skip).inc()
            return False
        handed = ex.state.get(EMBEDDED)  # the screen embedded this very text with this embedder
        try:  # any embedder failure or delay: the exact path only
            if handed is not None and handed[0] is m.embedder and handed[1] == text:
                f.vector = handed[2]
            else:
                async with asyncio.timeout(self.b.config.semantic.embed_timeout_ms / 1000):
                    # The guards read the query while the model runs: the loop would wait idle.
                    f.vector = await m.embedder.embed(text, partial(read_ahead, text))
        except EmbedShedError:  # could not arrive in time: shed early and counted (gate_embed_shed_total)
            self.b.metrics.cache_semantic_skips.labels("embed_shed").inc()
            return False
        except Exception:
            self.b.metrics.cache_semantic_skips.labels("embed_error").inc()
            return False
        assert f.vector is not None
        f.bands = tuple(m.lsh.band_keys(f.vector))
        return True

    async def _nearest(self, f: Flight, m: Matcher) -> tuple[str, float, Entry | None, str] | None:
        """The nearest candidate that still has a question to compare: (key, cosine, its entry
        or None while it is in flight, its question). Only that one entry is decoded."""
        assert f.vector is not None
        store, scope = self.b.store, f.q.scope
        limit = self.b.config.semantic.max_candidates
        found = await self.b.call(store.candidates(scope, list(f.bands), limit), "candidates")
        # Its own key: answered by the exact lookup already, or this request's own announcement.
        ranked = [(k, c) for k, c in m.ranked(f.vector, found) if k != f.key]
        if not ranked:
            return None
        raws = await self.b.call(store.fetch(scope, [k for k, _ in ranked]), "fetch")
        flying = [k for (k, _), raw in zip(ranked, raws, strict=True) if raw is None]
        texts = await self.b.call(store.in_flight(scope, flying), "in_flight") if flying else []
        questions = dict(zip(flying, texts, strict=False))
        for (key, cosine), raw in zip(ranked, raws, strict=True):
            entry = _load(raw) if raw is not None else None
            other = entry.text if entry is not None else questions.get(key) if raw is None else None
            if other is not None:
                return key, cosine, entry, other
        return None

    async def _join(self, ex: Exchange, f: Flight, key: str, cosine: float, kind: Kind) -> Found | None:
        """The same question is in flight under another prompt: wait for its answer."""
        c = self.b.config
        if not (c.coalesce.enabled and c.semantic.join_in_flight):
            return None
        started = self.b.clock()
        raw = await self.b.leases.join(f.q.scope, key, min(c.coalesce.max_wait_s, self.may_wait_s(ex)))
        ex.waited_s += self.b.clock() - started
        entry = _load(raw) if raw is not None else None
        if entry is None:
            return None  # it ended without an answer: this request asks the model itself
        await self.keeper.alias(f, entry, key, cosine)
        return Found(entry, key, "coalesced", kind, cosine)


def _load(raw: bytes) -> Entry | None:
    with contextlib.suppress(Exception):
        return Entry.load(raw)
    return None
