"""Dedup: answer a question already answered (word for word, near-exact or by meaning), and
let identical requests in flight wait for one answer instead of each calling the model.

Order, cheapest first: the exact key (one store call, which also elects the leader of an
identical burst), then one embedding and the semantic lookup. A hit is an immediate response
and nothing after this stage runs. On a miss the answer is captured and stored when complete,
and the lease is handed back however the exchange ends. Every store call is time-boxed: on
failure the request skips the cache and flows on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..cache.entry import Capture, Entry, content_kind
from ..cache.flight import Flight, Wakeups
from ..cache.keys import exact_key, normalise, question
from ..cache.replay import replay
from ..cache.rules import access
from ..cache.semantic import Matcher
from ..cache.store import Lookup, Put, Store
from ..config import Cache as CacheConfig
from ..config import SemanticProfile
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..redis_conn import timeboxed
from .base import Stage

CACHE_HEADER = "x-gate-cache"
SIMILARITY_HEADER = "x-gate-similarity"
MATCH_HEADER = "x-gate-cache-match"
KEY_HEADER = "x-gate-cache-key"
T = TypeVar("T")
Profile = tuple[SemanticProfile, Matcher | None]


class Cache(Stage):
    name = "cache"

    def __init__(
        self, config: CacheConfig, store: Store, metrics: Metrics, matcher: Matcher | None,
        op_timeout_s: float, *, canon: Callable[[str], str] = normalise,
        clock: Callable[[], float] = time.monotonic, may_wait_s: Callable[[Exchange], float] | None = None,
        profiles: Sequence[Profile] = (),
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.matcher = matcher
        self.profiles = profiles  # per tenant / route: another embedder or operating point
        self.op_timeout_s = op_timeout_s
        self.canon = canon
        self.clock = clock
        # How long a request may wait for a slot (its admission deadline): a follower waits no longer.
        self.may_wait_s = may_wait_s or (lambda ex: config.coalesce.max_wait_s)
        self.embed_timeout_s = config.semantic.embed_timeout_ms / 1000
        self.flights: dict[str, Flight] = {}  # by request id, until on_done
        self.wakeups = Wakeups()

    async def _timed(self, f: Flight, call: Awaitable[T], op: str) -> T | None:
        result = await timeboxed(call, None, self.op_timeout_s, self.metrics, f"cache_{op}")
        if result is None:
            f.store_ok = False
        return result

    # ------------------------------------------------------------------ request

    async def on_request(self, ex: Exchange) -> Reply | None:
        if not self.config.enabled or ex.payload is None:
            return None
        acc = access(ex.payload, ex.headers, self.config.max_temperature)
        if acc.bypass:
            self._outcome(ex, "bypass")
            return None
        q = question(ex.payload, ex.route_path, ex.tenant, self.config.shared_across_tenants)
        options = ex.payload.get("stream_options")
        f = Flight(q, exact_key(q, self.canon), acc, bool(ex.payload.get("stream")),
                   isinstance(options, dict) and bool(options.get("include_usage")))
        self.flights[ex.request_id] = f
        if acc.lookup:
            reply = await self._exact(ex, f)
            if reply is not None:
                return reply
            if not f.store_ok:
                self._outcome(ex, "skipped")
                return None
        reply = await self._semantic(ex, f)
        if reply is not None:
            return reply
        self._outcome(ex, "skipped" if not f.store_ok else "miss")
        return None

    def _outcome(self, ex: Exchange, result: str) -> None:
        self.metrics.cache_requests.labels(result).inc()
        ex.client_headers[CACHE_HEADER] = "bypass" if result == "skipped" else result

    async def _exact(self, ex: Exchange, f: Flight) -> Reply | None:
        coalesce = self.config.coalesce
        token = uuid.uuid4().hex if coalesce.enabled and f.access.store else None
        found = await self._timed(f, self._lookup(f, token), "lookup")
        followed = found is not None and found.role == "follower" and token is not None
        if followed and token is not None:
            found = await self._follow(f, token, min(self.config.coalesce.max_wait_s, self.may_wait_s(ex)))
        if found is None:
            return None
        if found.role == "leader":
            self._lead(f, token)
        elif found.role == "hit" and found.entry is not None:
            return self._hit(ex, f, found.entry, "coalesced" if followed else "hit", f.key)
        return None

    async def _follow(self, f: Flight, token: str, wait_s: float) -> Lookup | None:
        """Wait for the leader's answer, as long as this request may wait; None: go upstream."""
        c = self.config.coalesce
        started = self.clock()
        deadline, delay = started + wait_s, c.poll_ms / 1000
        outcome, found = "timeout", None
        while (remaining := deadline - self.clock()) > 0:
            await self.wakeups.wait(f.slot, min(delay, remaining))
            found = await self._timed(f, self._lookup(f, token), "lookup")
            if found is None:
                outcome = "store_error"
                break
            if found.role in ("hit", "leader"):
                outcome = "answered" if found.role == "hit" else "promoted"
                break
            delay = min(delay * 2, c.poll_max_ms / 1000)
        self.metrics.cache_coalesce_wait.labels(outcome).observe(self.clock() - started)
        return found if outcome in ("answered", "promoted") else None

    def _lead(self, f: Flight, token: str | None) -> None:
        f.token = token
        if token is not None:
            f.keepalive = asyncio.ensure_future(self._keep_lease(f, token))

    async def _keep_lease(self, f: Flight, token: str) -> None:
        lease_s = self.config.coalesce.lease_s
        while f.token == token:
            await asyncio.sleep(lease_s / 3)
            if f.token == token:
                await timeboxed(self.store.renew(f.q.scope, f.key, token, self._lease_ms()), False,
                                self.op_timeout_s, self.metrics, "cache_renew")

    def _lookup(self, f: Flight, token: str | None) -> Awaitable[Lookup]:
        return self.store.lookup(f.q.scope, f.key, token, self._lease_ms())

    def _lease_ms(self) -> int:
        return int(self.config.coalesce.lease_s * 1000)

    async def aclose(self) -> None:
        matchers = {id(m): m for m in [self.matcher, *(m for _, m in self.profiles)] if m is not None}
        for m in matchers.values():
            close = getattr(m.embedder, "aclose", None)
            if close is not None:
                await close()

    def matcher_for(self, ex: Exchange) -> Matcher | None:
        for profile, matcher in self.profiles:
            if profile.applies(ex.tenant, ex.route_path):
                return matcher
        return self.matcher

    async def _semantic(self, ex: Exchange, f: Flight) -> Reply | None:
        m, text = self.matcher_for(ex), f.q.text
        if m is None or text is None or not f.store_ok:
            return None
        skip = m.skip_reason(text)
        if skip is not None:
            self.metrics.cache_semantic_skips.labels(skip).inc()
            return None
        try:  # any embedder failure or delay: the exact path only
            async with asyncio.timeout(self.embed_timeout_s):
                f.vector = await m.embedder.embed(text)
        except Exception:
            self.metrics.cache_semantic_skips.labels("embed_error").inc()
            return None
        f.bands = tuple(m.lsh.band_keys(f.vector))
        if not f.access.lookup:
            return None
        limit = self.config.semantic.max_candidates
        found = await self._timed(f, self.store.candidates(f.q.scope, list(f.bands), limit), "candidates")
        ranked = m.ranked(f.vector, found or [])
        if not ranked:
            return None
        raws = await self._timed(f, self.store.fetch(f.q.scope, [k for k, _ in ranked]), "fetch")
        for (key, cosine), raw in zip(ranked, raws or [], strict=False):
            if raw is None:
                continue
            entry = _load(raw)
            if entry is None:
                continue
            decision = m.same(text, entry.text, cosine)
            if not decision.same:
                return None
            if f.access.store:
                await self._alias(f, entry, key, cosine)
            kind = "near" if decision.reason == "near-exact" else "semantic"
            return self._hit(ex, f, raw, "hit", key, cosine, kind)
        return None

    async def _alias(self, f: Flight, entry: Entry, source: str, cosine: float) -> None:
        """Keep the paraphrase's answer under its own exact key: its repeats and followers need no model."""
        alias = Entry(entry.kind, entry.body, entry.events, f.q.text or "", entry.model, entry.tenant,
                      time.time(), source=source, similarity=cosine)
        ttl = min(self.config.alias_ttl_s, self.config.ttl_s)
        await self._put(f, alias, ttl, with_vector=False)

    def _hit(
        self, ex: Exchange, f: Flight, raw: bytes, result: str, key: str, similarity: float = 1.0,
        kind: str | None = None,
    ) -> Reply | None:
        entry = _load(raw)
        if entry is None:
            return None
        if kind is None:
            exact = f.q.text is None or normalise(entry.text) == normalise(f.q.text)
            kind = "exact" if exact else "near"
            if entry.source:  # an alias: answered from a paraphrase
                kind, similarity, key = "semantic", entry.similarity, entry.source
        chat = ex.route_path.endswith("/chat/completions")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        ctype, body = replay(entry, f.stream, f.include_usage, rid, int(time.time()))
        f.served = True
        self.metrics.cache_requests.labels(result).inc()
        self.metrics.cache_hits.labels(kind).inc()
        if kind == "semantic":
            self.metrics.cache_similarity.observe(similarity)
        headers = {"content-type": ctype, CACHE_HEADER: result, SIMILARITY_HEADER: f"{similarity:.4f}",
                   MATCH_HEADER: kind, KEY_HEADER: f"{f.q.scope}.{key}"}
        return Reply(200, body, headers, decision="cache_hit" if result == "hit" else "coalesced")

    # ------------------------------------------------------------------ response

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        f = self.flights.get(ex.request_id)
        if f is None or f.served:
            return
        kind = content_kind(headers.get("content-type", ""))
        if 200 <= status < 300 and kind is not None and f.access.store and f.store_ok:
            f.capture = Capture(kind, self.config.max_entry_bytes, self.clock)
            ex.capture_body = True
            return
        if f.access.store and f.store_ok:
            self.metrics.cache_stores.labels("uncacheable").inc()
        await self._release(f)

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        f = self.flights.get(ex.request_id)
        if f is None or f.capture is None:
            return
        f.capture.feed(chunk)
        if not end:
            return
        capture, f.capture = f.capture, None
        kept = capture.finish(self.config.cache_tool_calls)
        if kept is None:
            self.metrics.cache_stores.labels("uncacheable").inc()
            await self._release(f)
            return
        body, events = kept
        entry = Entry(capture.kind, body, events, f.q.text or "", f.q.model, f.q.tenant, time.time())
        await self._put(f, entry, self.config.ttl_s, with_vector=True)

    async def _put(self, f: Flight, entry: Entry, ttl_s: float, *, with_vector: bool) -> None:
        vector = f.vector.astype("float32").tobytes() if with_vector and f.vector is not None else None
        item = Put(f.q.scope, f.key, entry.dump(), int(ttl_s * 1000), self.config.max_entries_per_scope,
                   f.q.tenant, f.q.model, vector, f.bands if vector else (), f.token)
        done = await timeboxed(_true(self.store.put(item)), False, self.op_timeout_s, self.metrics,
                               "cache_put")
        self.metrics.cache_stores.labels("stored" if done else "failed").inc()
        if done:
            self._stop_leading(f)
        else:
            await self._release(f)

    def _stop_leading(self, f: Flight) -> None:
        f.token = None
        if f.keepalive is not None:
            f.keepalive.cancel()
            f.keepalive = None
        self.wakeups.wake(f.slot)

    async def _release(self, f: Flight) -> None:
        token = f.token
        self._stop_leading(f)
        if token is not None:
            await timeboxed(self.store.release(f.q.scope, f.key, token), False, self.op_timeout_s,
                            self.metrics, "cache_release")

    async def on_done(self, ex: Exchange) -> None:
        f = self.flights.pop(ex.request_id, None)
        if f is not None and f.token is not None:
            await self._release(f)



async def _true(call: Awaitable[None]) -> bool:
    await call
    return True


def _load(raw: bytes) -> Entry | None:
    with contextlib.suppress(Exception):
        return Entry.load(raw)
    return None
