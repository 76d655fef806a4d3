"""Dedup: answer a question already answered (word for word, near-exact or by meaning), and
let identical requests in flight wait for one answer instead of each calling the model.

Order, cheapest first: the exact key (one store call, which also elects the leader of an
identical burst), then one embedding and the semantic lookup. A hit is an immediate response
and nothing after this stage runs. A leader with a vector announces its flight, so a
paraphrase judged the same question while the model still runs waits for that answer
(joins the flight) instead of calling the model again. On a miss the answer is captured and
stored when complete, and the lease is handed back however the exchange ends (coalescing:
`cache/lease.py`).
While the store is up, its calls wait within their budget; when it is down, or one call
fails, the request skips the cache and flows on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..cache.entry import Capture, Count, Entry, content_kind
from ..cache.flight import Flight
from ..cache.keys import exact_key, normalise, question
from ..cache.lease import Leases
from ..cache.replay import replay
from ..cache.rules import access
from ..cache.selfcheck import CHECK_HEADER_VALUE, Check, SelfCheck
from ..cache.setup import Matchers
from ..cache.store import Pending, Put, Store
from ..config import Cache as CacheConfig
from ..config import Config
from ..dedup.canonical import canonical
from ..embed.batching import EmbedShedError
from ..errors import SHOULD_RETRY, error_reply
from ..exchange import Exchange, Reply, new_id
from ..metrics import Metrics
from ..redis_conn import StoreGuard
from ..request import client_timeout_s, wants_stream, wants_usage
from ..tasks import Tasks
from .base import Stage, payload_of

if TYPE_CHECKING:
    from ..services import Services

CACHE_HEADER = "x-gate-cache"
SIMILARITY_HEADER = "x-gate-similarity"
MATCH_HEADER = "x-gate-cache-match"
KEY_HEADER = "x-gate-cache-key"
RETRY_COUNT_HEADER = "x-stainless-retry-count"  # OpenAI's SDKs: 0 on the first attempt
ABANDONED_TTL_MS = 60_000
CHECK = "cache.check"  # ex.state: the self-check this request carries upstream
T = TypeVar("T")


class Cache(Stage):
    name = "cache"
    fail_closed = False
    store_down = "skipped"  # no hits, no coalescing: every request goes to the model

    def __init__(
        self, config: CacheConfig, store: Store, leases: Leases, guard: StoreGuard, metrics: Metrics,
        matchers: Matchers, *, canon: Callable[[str], str] = normalise,
        clock: Callable[[], float] = time.monotonic, may_wait_s: Callable[[Exchange], float] | None = None,
        op_timeout_s: float | None = None, count: Count | None = None, tasks: Tasks | None = None,
        selfcheck: SelfCheck | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.leases = leases
        self.guard = guard
        self.metrics = metrics
        self.matchers = matchers
        self.canon = canon
        self.clock = clock
        # How long a request may wait for a slot (its admission deadline): a follower waits no longer.
        self.may_wait_s = may_wait_s or (lambda ex: config.coalesce.max_wait_s)
        self.op_timeout_s = op_timeout_s
        self.count = count  # the gate's tokenizer, for the usage of answers that came without one
        self.tasks = tasks  # announcing a flight runs beside the request, not in its way
        self.embed_timeout_s = config.semantic.embed_timeout_ms / 1000
        self.selfcheck = selfcheck  # semantic candidates served only from bins that checks proved

    @classmethod
    def build(cls, config: Config, services: Services) -> Cache:
        admission, c = config.admission, config.cache

        def may_wait_s(ex: Exchange) -> float:
            return admission.deadline_s(ex.priority) if admission.enabled else c.coalesce.max_wait_s

        budget = c.op_timeout_ms / 1000 if c.op_timeout_ms is not None else None
        return cls(c, services.answers, services.leases, services.store, services.metrics, services.matchers,
                   canon=canonical, may_wait_s=may_wait_s, op_timeout_s=budget, count=services.tokens.count,
                   tasks=services.tasks, selfcheck=services.selfcheck)

    async def _timed(self, f: Flight, call: Coroutine[Any, Any, T], op: str) -> T | None:
        result = await self.guard.run(call, None, f"cache_{op}", self.op_timeout_s)
        if result is None:
            f.store_ok = False
        return result

    def runs(self, hook: str) -> bool:
        return self.config.enabled

    # ------------------------------------------------------------------ request

    async def on_request(self, ex: Exchange) -> Reply | None:
        if not self.config.enabled:
            return None
        payload = payload_of(ex)
        acc = access(payload, ex.headers, self.config.max_temperature)
        if acc.bypass:
            self._outcome(ex, "bypass")
            return None
        q = question(payload, ex.route_path, ex.tenant, self.config.shared_across_tenants)
        f = Flight(q, exact_key(q, self.canon), acc, wants_stream(payload), wants_usage(payload))
        ex.state[self.name] = f
        if acc.lookup and f.access.store:
            reply = await self._retry_in_vain(ex, f)
            if reply is not None:
                return reply
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
        checked = CHECK in ex.state
        self._outcome(ex, "skipped" if not f.store_ok else CHECK_HEADER_VALUE if checked else "miss")
        self._announce(f)
        return None

    def _announce(self, f: Flight) -> None:
        """A leader with a vector: paraphrases arriving while the model runs may wait for it."""
        if not self.config.semantic.join_in_flight or self.tasks is None:
            return
        if f.token is None or f.vector is None or not f.bands or f.q.text is None:
            return
        ttl_ms = int(self.config.coalesce.max_wait_s * 1000)
        item = Pending(f.q.scope, f.key, f.q.text, f.vector.astype("float32").tobytes(), f.bands, ttl_ms)
        self.tasks.spawn(self.guard.run(self.store.pend(item), None, "cache_pend", self.op_timeout_s),
                         "cache_pend")

    async def _retry_in_vain(self, ex: Exchange, f: Flight) -> Reply | None:
        """A client's retry of a request whose last attempt it gave up on, after at least as
        long as it will wait now: the model takes longer than the client's timeout, and this
        attempt would only cost another model call that nobody reads. Only OpenAI's SDKs say
        both (x-stainless-retry-count, x-stainless-read-timeout)."""
        timeout_s = client_timeout_s(ex.headers)
        if timeout_s is None or ex.headers.get(RETRY_COUNT_HEADER, "0") in ("", "0"):
            return None
        waited_ms = await self._timed(f, self.store.abandoned(f.q.scope, f.key), "abandoned")
        if waited_ms is None or waited_ms < timeout_s * 1000 * 0.9:
            return None
        self.metrics.cache_requests.labels("retry_refused").inc()
        return error_reply(
            504,
            f"The model took longer than this client's timeout ({timeout_s:g} s) on the last attempt "
            f"of this request ({waited_ms / 1000:.1f} s and still running); another attempt would "
            "end the same way. Raise the client's timeout, or ask for fewer tokens.",
            type="timeout",
            code="client_timeout_too_short",
            headers={SHOULD_RETRY: "false"},
            decision="retry_refused",
        )

    def _outcome(self, ex: Exchange, result: str) -> None:
        self.metrics.cache_requests.labels(result).inc()
        ex.client_headers[CACHE_HEADER] = "bypass" if result == "skipped" else result

    async def _exact(self, ex: Exchange, f: Flight) -> Reply | None:
        c = self.config.coalesce
        lead = c.enabled and f.access.store
        wait_s = min(c.max_wait_s, self.may_wait_s(ex))
        started = self.clock()
        claim = await self.leases.claim(f.q.scope, f.key, lead=lead, wait_s=wait_s)
        if claim.coalesced:
            ex.waited_s += self.clock() - started
        if claim.role == "unavailable":
            f.store_ok = False
        elif claim.role == "leader":
            f.token = claim.token
        elif claim.role == "hit" and claim.entry is not None:
            return self._hit(ex, f, claim.entry, "coalesced" if claim.coalesced else "hit", f.key)
        return None

    async def _semantic(self, ex: Exchange, f: Flight) -> Reply | None:
        m, text = self.matchers.for_request(ex.tenant, ex.route_path), f.q.text
        if m is None or text is None or not f.store_ok:
            return None
        skip = m.skip_reason(text)
        if skip is not None:
            self.metrics.cache_semantic_skips.labels(skip).inc()
            return None
        try:  # any embedder failure or delay: the exact path only
            async with asyncio.timeout(self.embed_timeout_s):
                f.vector = await m.embedder.embed(text)
        except EmbedShedError:  # could not arrive in time: shed early and counted (gate_embed_shed_total)
            self.metrics.cache_semantic_skips.labels("embed_shed").inc()
            return None
        except Exception:
            self.metrics.cache_semantic_skips.labels("embed_error").inc()
            return None
        f.bands = tuple(m.lsh.band_keys(f.vector))
        if not f.access.lookup:
            return None
        limit = self.config.semantic.max_candidates
        found = await self._timed(f, self.store.candidates(f.q.scope, list(f.bands), limit), "candidates")
        # Its own key: answered by the exact lookup already, or this request's own announcement.
        ranked = [(k, c) for k, c in m.ranked(f.vector, found or []) if k != f.key]
        if not ranked:
            return None
        raws = await self._timed(f, self.store.fetch(f.q.scope, [k for k, _ in ranked]), "fetch")
        if raws is None:
            return None
        flying = [k for (k, _), raw in zip(ranked, raws, strict=True) if raw is None]
        texts = await self._timed(f, self.store.in_flight(f.q.scope, flying), "in_flight") if flying else []
        questions = dict(zip(flying, texts or [], strict=False))
        for (key, cosine), raw in zip(ranked, raws, strict=True):
            entry = _load(raw) if raw is not None else None
            other = entry.text if entry is not None else questions.get(key)
            if other is None:
                continue
            await m.warm([text, other])  # token states for the verifier, off the event loop
            decision = m.same(text, other, cosine)
            if not decision.same:
                return None
            if self.selfcheck is not None and decision.reason == "semantic":
                # A flight in a bin that is not serving goes upstream unjoined (nothing to compare yet).
                check = await self.selfcheck.judge(ex.tenant, text, entry, decision.score, m)
                if check is not None:  # upstream: served fresh, compared with `entry` once complete
                    ex.state[CHECK] = check
                    return None
            kind = "near" if decision.reason == "near-exact" else "semantic"
            if raw is None:
                return await self._join(ex, f, key, cosine, kind)
            if entry is not None:
                await self._alias(f, entry, key, cosine)
            return self._hit(ex, f, raw, "hit", key, cosine, kind)
        return None

    async def _join(self, ex: Exchange, f: Flight, key: str, cosine: float, kind: str) -> Reply | None:
        """The same question is in flight under another prompt: wait for its answer."""
        if not (self.config.coalesce.enabled and self.config.semantic.join_in_flight):
            return None
        started = self.clock()
        wait_s = min(self.config.coalesce.max_wait_s, self.may_wait_s(ex))
        raw = await self.leases.join(f.q.scope, key, wait_s)
        ex.waited_s += self.clock() - started
        entry = _load(raw) if raw is not None else None
        if raw is None or entry is None:
            return None  # it ended without an answer: this request asks the model itself
        await self._alias(f, entry, key, cosine)
        return self._hit(ex, f, raw, "coalesced", key, cosine, kind)

    async def _alias(self, f: Flight, entry: Entry, source: str, cosine: float) -> None:
        """Keep the paraphrase's answer under its own exact key: its repeats and followers need no model.
        Not under self-check: a repeat asks its bin again, as an alias would outlive a bin that stopped."""
        if not f.access.store or self.selfcheck is not None:
            return
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
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{new_id()}"
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
        f = ex.state.get(self.name)
        if not isinstance(f, Flight) or f.served:
            return
        kind = content_kind(headers.get("content-type", ""))
        if 200 <= status < 300 and kind is not None and f.access.store and f.store_ok:
            f.capture = Capture(kind, self.config.max_entry_bytes, self.clock, ex.prompt_tokens, self.count)
            ex.capture_body = True
            return
        if f.access.store and f.store_ok:
            self.metrics.cache_stores.labels("uncacheable").inc()
        await self._finish(f, None, stored=False)

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        f = ex.state.get(self.name)
        if not isinstance(f, Flight) or f.capture is None:
            return
        f.capture.feed(chunk)
        # A stream is whole at [DONE]: store it before [DONE] goes on to the client, which may
        # close the connection right there (OpenAI's sync SDK does) before Envoy's end arrives.
        if not end and not f.capture.complete:
            return
        capture, f.capture = f.capture, None
        kept = capture.finish(self.config.cache_tool_calls)
        if kept is None:
            self.metrics.cache_stores.labels("uncacheable").inc()
            await self._finish(f, None, stored=False)
            return
        body, events = kept
        check = ex.state.get(CHECK)
        if isinstance(check, Check) and self.selfcheck is not None:
            self.selfcheck.compare(check, capture.kind, body, events)
        entry = Entry(capture.kind, body, events, f.q.text or "", f.q.model, f.q.tenant, time.time())
        await self._put(f, entry, self.config.ttl_s, with_vector=True)

    async def _put(self, f: Flight, entry: Entry, ttl_s: float, *, with_vector: bool) -> None:
        vector = f.vector.astype("float32").tobytes() if with_vector and f.vector is not None else None
        raw = entry.dump()
        item = Put(f.q.scope, f.key, raw, int(ttl_s * 1000), self.config.max_entries_per_scope,
                   f.q.tenant, f.q.model, vector, f.bands if vector else (), f.token)
        done = await self.guard.run(_true(self.store.put(item)), False, "cache_put", self.op_timeout_s)
        self.metrics.cache_stores.labels("stored" if done else "failed").inc()
        await self._finish(f, raw, stored=done)

    async def _finish(self, f: Flight, entry: bytes | None, *, stored: bool) -> None:
        """Lead no more: followers get `entry` (or one of them takes over), the lease goes back."""
        token, f.token = f.token, None
        if token is not None:
            await self.leases.finish(f.q.scope, f.key, token, entry, stored=stored)

    async def on_done(self, ex: Exchange) -> None:
        f = ex.state.get(self.name)
        if not isinstance(f, Flight) or f.token is None:
            return
        if ex.status is None and ex.upstream_started is not None:  # its client gave up waiting
            waited_ms = round((time.perf_counter() - ex.upstream_started) * 1000)
            await self.guard.run(self.store.abandon(f.q.scope, f.key, waited_ms, ABANDONED_TTL_MS), None,
                                 "cache_abandon", self.op_timeout_s)
        await self._finish(f, None, stored=False)


async def _true(call: Coroutine[Any, Any, None]) -> bool:
    await call
    return True


def _load(raw: bytes) -> Entry | None:
    with contextlib.suppress(Exception):
        return Entry.load(raw)
    return None
