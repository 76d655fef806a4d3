"""The cache store: entries, LSH buckets and in-flight leases, per scope.

Two implementations with one behaviour (one table of tests runs against both): `MemoryStore`
here (one process, the embedded default) and `RedisStore` (every process and replica).
Entries expire after their TTL; a scope keeps at most `max_entries`, dropping the ones that
expire first. A lease names the one request (the leader) that computes an answer the others
wait for; it expires on its own if the leader's process dies.

An LSH bucket keeps at most `band_cap` keys (the ones that expire last): on template-like
traffic one bucket would otherwise hold most of a scope, and a candidates call would read it
all. A key dropped from a full bucket stays in its other buckets and in the exact index.

A leader may announce its request while the model runs (`pend`): its vector joins the
buckets and its question text is kept, so a paraphrase arriving meanwhile finds it among the
candidates (with no entry yet) and can wait for that answer instead of calling the model
again. The answer's `put` replaces the announcement; an announcement nobody answered expires.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .hot import Purged

Role = Literal["hit", "leader", "follower", "none"]
DEFAULT_BAND_CAP = 64  # load/results/bench_candidates.md, load/results/lsh_recall.md


@dataclass(frozen=True)
class Lookup:
    role: Role
    entry: bytes | None = None


@dataclass(frozen=True)
class Pending:
    """A leader's request in flight, announced for paraphrases to find (see `Store.pend`)."""

    scope: str
    key: str
    text: str
    vector: bytes
    bands: tuple[str, ...]
    ttl_ms: int
    band_cap: int = DEFAULT_BAND_CAP


@dataclass(frozen=True)
class Put:
    scope: str
    key: str
    entry: bytes
    ttl_ms: int
    max_entries: int
    tenant: str
    model: str
    vector: bytes | None = None  # float32; None: exact lookups only (aliases, unreadable text)
    bands: tuple[str, ...] = ()
    token: str | None = None  # the lease to hand back once the entry is in
    band_cap: int = DEFAULT_BAND_CAP  # keys one LSH bucket keeps, those that expire last


class Store(Protocol):
    async def lookup(self, scope: str, key: str, token: str | None, lease_ms: int) -> Lookup:
        """The entry; else take the lease (leader) unless another holds it (follower).

        Idempotent by `token`: the lease's own holder asking again is the leader again (and
        renews it), so a lookup that ran twice cannot make a request follow itself.
        With `token` None, only look: `follower` while another leads, else `none`.
        """

    async def candidates(self, scope: str, bands: list[str], limit: int) -> list[tuple[str, bytes]]:
        """(key, vector) of live entries sharing at least one band; past `limit`, those that
        share the most bands (the likeliest to be the closest), then by key. Reads at most
        len(bands) x band_cap bucket members, whatever the scope holds."""

    async def fetch(self, scope: str, keys: list[str]) -> list[bytes | None]: ...

    async def put(self, item: Put) -> None: ...

    async def pend(self, item: Pending) -> None:
        """Announce a request in flight (no-op when its key already has an entry)."""

    async def in_flight(self, scope: str, keys: list[str]) -> list[str | None]:
        """The question text of each key announced and not yet answered."""

    async def release(self, scope: str, key: str, token: str) -> bool:
        """Hand back a lease if this token still holds it."""

    async def renew(self, scope: str, key: str, token: str, lease_ms: int) -> bool: ...

    async def abandon(self, scope: str, key: str, waited_ms: int, ttl_ms: int) -> None:
        """Note that a leader's client gave up on this key after `waited_ms` (kept `ttl_ms`)."""

    async def abandoned(self, scope: str, key: str) -> int | None:
        """How long the last abandoned attempt at this key waited, if one is noted."""

    async def purge(
        self, *, tenant: str | None = None, model: str | None = None, scope: str | None = None,
        key: str | None = None,
    ) -> int:
        """Drop entries by tenant and/or model, or one entry by scope and key; returns how many.
        Every subscriber (`on_purge`) of every process sharing the store hears of it."""

    def on_purge(self, tell: Callable[[Purged], None]) -> None:
        """Call `tell` with each purge of the store (`Purged()`, nothing named: anything may
        have been purged, e.g. while a subscription was broken)."""

    async def aclose(self) -> None: ...


def _compacted(pairs: list[tuple[float, str]], live: dict[str, float]) -> list[tuple[float, str]]:
    """An (expiry, key) heap rebuilt from the live keys once it is mostly stale pairs."""
    if len(pairs) <= 2 * len(live) + 64:
        return pairs
    fresh = [(exp, k) for k, exp in live.items()]
    heapq.heapify(fresh)
    return fresh


@dataclass
class _Band:
    """One LSH bucket: its keys with their expiry, and (expiry, key) soonest first, the order
    in which the expired and those beyond the cap go (a pair whose key has since left or come
    back with another expiry no longer matches `members` and is skipped)."""

    members: dict[str, float] = field(default_factory=dict)
    by_expiry: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class _Scope:
    expiry: dict[str, float] = field(default_factory=dict)  # key -> expiry
    vectors: dict[str, bytes] = field(default_factory=dict)
    sigs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bands: dict[str, _Band] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # announced keys in flight -> question
    # (expiry, key), soonest first, as Redis's sorted set ranks them: the expired and the
    # oldest are found without a scan of the scope. A pair whose key has since been dropped or
    # stored again no longer matches `expiry` and is skipped.
    by_expiry: list[tuple[float, str]] = field(default_factory=list)
    tenant: str = ""
    model: str = ""


class MemoryStore:
    """The same algorithm as the Redis scripts, in dicts, for one process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.entries: dict[tuple[str, str], bytes] = {}
        self.leases: dict[tuple[str, str], tuple[str, float]] = {}
        self.scopes: dict[str, _Scope] = {}
        self.given_up: dict[tuple[str, str], tuple[int, float]] = {}  # waited ms, until
        self._purge_subscribers: list[Callable[[Purged], None]] = []

    def on_purge(self, tell: Callable[[Purged], None]) -> None:
        self._purge_subscribers.append(tell)

    async def lookup(self, scope: str, key: str, token: str | None, lease_ms: int) -> Lookup:
        now = self.clock()
        entry = self._entry(scope, key, now)
        if entry is not None:
            return Lookup("hit", entry)
        held = self.leases.get((scope, key))
        if token is None:
            return Lookup("follower" if held is not None and held[1] > now else "none")
        if held is not None and held[1] > now and held[0] != token:
            return Lookup("follower")
        self.leases[(scope, key)] = (token, now + lease_ms / 1000)
        return Lookup("leader")

    def _entry(self, scope: str, key: str, now: float) -> bytes | None:
        s = self.scopes.get(scope)
        if s is None or s.expiry.get(key, 0.0) <= now:
            return None
        return self.entries.get((scope, key))

    async def candidates(self, scope: str, bands: list[str], limit: int) -> list[tuple[str, bytes]]:
        s = self.scopes.get(scope)
        if s is None:
            return []
        now, out, votes = self.clock(), [], Counter[str]()
        for band in bands:
            found = s.bands.get(band)
            if found is not None:
                votes.update(found.members.keys())
        # Most shared bands first, then by key, as the Redis script: the keys grouped by their
        # count, and a group sorted only when it is reached.
        by: dict[int, list[str]] = {}
        for key, n in votes.items():
            by.setdefault(n, []).append(key)
        for n in sorted(by, reverse=True):
            for key in sorted(by[n]):
                # A key's band memberships carry its expiry (`_index`; `_drop` removes them all).
                vector = s.vectors.get(key)
                if vector is not None and s.expiry.get(key, 0.0) > now:
                    out.append((key, vector))
                    if len(out) >= limit:
                        return out
        return out

    async def fetch(self, scope: str, keys: list[str]) -> list[bytes | None]:
        now = self.clock()
        return [self._entry(scope, key, now) for key in keys]

    async def put(self, item: Put) -> None:
        now = self.clock()
        s = self.scopes.setdefault(item.scope, _Scope())
        s.tenant, s.model = item.tenant, item.model
        self._drop(item.scope, s, item.key)
        self.entries[(item.scope, item.key)] = item.entry
        s.expiry[item.key] = now + item.ttl_ms / 1000
        heapq.heappush(s.by_expiry, (s.expiry[item.key], item.key))
        if item.vector is not None:
            self._index(s, item.key, item.vector, item.bands, item.band_cap, now)
        if item.token is not None:
            await self.release(item.scope, item.key, item.token)
        while s.by_expiry and s.by_expiry[0][0] <= now:  # the expired (a stale pair only leaves)
            exp, key = heapq.heappop(s.by_expiry)
            if s.expiry.get(key) == exp:
                self._drop(item.scope, s, key)
        while len(s.expiry) > item.max_entries and s.by_expiry:
            self._drop_first(item.scope, s)
        s.by_expiry = _compacted(s.by_expiry, s.expiry)

    def _drop_first(self, scope: str, s: _Scope) -> None:
        """Drop the entry that expires first (stale pairs on the way are discarded)."""
        while s.by_expiry:
            exp, key = heapq.heappop(s.by_expiry)
            if s.expiry.get(key) == exp:
                self._drop(scope, s, key)
                return

    async def pend(self, item: Pending) -> None:
        now = self.clock()
        s = self.scopes.setdefault(item.scope, _Scope())
        if self._entry(item.scope, item.key, now) is not None:
            return
        self._drop(item.scope, s, item.key)
        s.expiry[item.key] = now + item.ttl_ms / 1000
        heapq.heappush(s.by_expiry, (s.expiry[item.key], item.key))
        s.texts[item.key] = item.text
        self._index(s, item.key, item.vector, item.bands, item.band_cap, now)

    async def in_flight(self, scope: str, keys: list[str]) -> list[str | None]:
        s, now = self.scopes.get(scope), self.clock()
        if s is None:
            return [None] * len(keys)
        return [s.texts.get(k) if s.expiry.get(k, 0.0) > now else None for k in keys]

    def _index(
        self, s: _Scope, key: str, vector: bytes, bands: tuple[str, ...], cap: int, now: float
    ) -> None:
        s.vectors[key] = vector
        s.sigs[key] = bands
        for band in bands:
            self._into_band(s, band, key, s.expiry[key], cap, now)

    @staticmethod
    def _into_band(s: _Scope, band: str, key: str, expiry: float, cap: int, now: float) -> None:
        """As the Redis script: add, forget the expired, then keep the `cap` that expire last
        (the expired expire first: one walk from the soonest end does both)."""
        b = s.bands.setdefault(band, _Band())
        b.members[key] = expiry
        heapq.heappush(b.by_expiry, (expiry, key))
        while b.by_expiry:
            exp, old = b.by_expiry[0]
            if b.members.get(old) == exp and exp > now and len(b.members) <= cap:
                break
            heapq.heappop(b.by_expiry)
            if b.members.get(old) == exp:
                del b.members[old]
        b.by_expiry = _compacted(b.by_expiry, b.members)

    def _drop(self, scope: str, s: _Scope, key: str) -> None:
        self.entries.pop((scope, key), None)
        s.expiry.pop(key, None)
        s.texts.pop(key, None)
        s.vectors.pop(key, None)
        for band in s.sigs.pop(key, ()):
            found = s.bands.get(band)
            if found is not None:
                found.members.pop(key, None)
                if not found.members:
                    del s.bands[band]

    async def release(self, scope: str, key: str, token: str) -> bool:
        held = self.leases.get((scope, key))
        if held is None or held[0] != token:
            return False
        del self.leases[(scope, key)]
        return True

    async def abandon(self, scope: str, key: str, waited_ms: int, ttl_ms: int) -> None:
        now = self.clock()
        self.given_up = {k: v for k, v in self.given_up.items() if v[1] > now}
        self.given_up[(scope, key)] = (waited_ms, now + ttl_ms / 1000)

    async def abandoned(self, scope: str, key: str) -> int | None:
        noted = self.given_up.get((scope, key))
        return noted[0] if noted is not None and noted[1] > self.clock() else None

    async def renew(self, scope: str, key: str, token: str, lease_ms: int) -> bool:
        held = self.leases.get((scope, key))
        if held is None or held[0] != token or held[1] <= self.clock():
            return False
        self.leases[(scope, key)] = (token, self.clock() + lease_ms / 1000)
        return True

    async def purge(
        self, *, tenant: str | None = None, model: str | None = None, scope: str | None = None,
        key: str | None = None,
    ) -> int:
        if scope is not None and key is not None:
            for tell in self._purge_subscribers:
                tell(Purged(scope=scope, key=key))
            s = self.scopes.get(scope)
            if s is None or key not in s.expiry:
                return 0
            self._drop(scope, s, key)
            return 1
        if tenant is None and model is None:
            raise ValueError("purge needs a tenant, a model, or a scope and key")
        for tell in self._purge_subscribers:
            tell(Purged(tenant=tenant, model=model))
        dropped = 0
        for name, s in list(self.scopes.items()):
            if (tenant is None or s.tenant == tenant) and (model is None or s.model == model):
                dropped += len(s.expiry)
                for k in list(s.expiry):
                    self._drop(name, s, k)
                del self.scopes[name]
        return dropped

    async def aclose(self) -> None:
        return None
