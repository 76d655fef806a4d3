"""Keeping a miss's answer: captured as it passes (JSON or SSE), stored, and the request's
followers handed it (or one of them the lead) however the exchange ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from ..exchange import Exchange
from .backing import Backing
from .entry import Capture, Count, Entry, content_kind
from .flight import Flight
from .selfcheck import Check
from .store import Put

ABANDONED_TTL_MS = 60_000
CHECK = "cache.check"  # ex.state: the self-check this request carries upstream
PUT_TASK = "cache_put"  # the background task that stores an answer


class Keeper:
    def __init__(self, backing: Backing, count: Count | None = None) -> None:
        self.b = backing
        self.count = count  # the gate's tokenizer, for the usage of answers that came without one

    async def headers(self, ex: Exchange, f: Flight, status: int, headers: dict[str, str]) -> None:
        """The answer's headers: capture it when it can be kept, else let the followers go."""
        kind = content_kind(headers.get("content-type", ""))
        if f.access.store and 200 <= status < 300 and kind is not None:
            limit = self.b.config.max_entry_bytes
            f.capture = Capture(kind, limit, self.b.clock, ex.prompt_tokens, self.count)
            ex.capture_body = True
            return
        if f.access.store:
            self.b.metrics.cache_stores.labels("uncacheable").inc()
        await self.finish(f, None, stored=False)

    async def body(self, ex: Exchange, f: Flight, chunk: bytes, end: bool) -> None:
        if f.capture is None:
            return
        f.capture.feed(chunk)
        # A stream is whole at [DONE]: its store starts before [DONE] goes on to the client, which
        # may close the connection right there (OpenAI's sync SDK does) before Envoy's end arrives.
        if not end and not f.capture.complete:
            return
        capture, f.capture = f.capture, None
        kept = capture.finish(self.b.config.cache_tool_calls)
        if kept is None:
            self.b.metrics.cache_stores.labels("uncacheable").inc()
            await self.finish(f, None, stored=False)
            return
        body, events = kept
        check = ex.state.get(CHECK)
        if isinstance(check, Check) and self.b.selfcheck is not None:
            self.b.selfcheck.compare(check, capture.kind, body, events)
        entry = Entry(capture.kind, body, events, f.q.text or "", f.q.model, f.q.tenant, time.time())
        await self.keep(f, entry, with_vector=True)

    async def alias(self, f: Flight, entry: Entry, source: str, cosine: float) -> None:
        """Keep a paraphrase's answer under its own exact key: its repeats and followers need no
        model. Not under self-check: a repeat asks its bin again, as an alias would outlive a
        bin that stopped."""
        if not f.access.store or self.b.selfcheck is not None:
            return
        alias = Entry(entry.kind, entry.body, entry.events, f.q.text or "", entry.model, entry.tenant,
                      time.time(), source=source, similarity=cosine)
        await self.keep(f, alias, with_vector=False)

    async def keep(self, f: Flight, entry: Entry, *, with_vector: bool) -> None:
        """Store `entry` under the request's key and hand it to the followers, beside the request:
        its answer goes on without waiting for the store. A Redis store's call is sent in the
        task's first step, in the same turn of the event loop, before the gate reads anything
        more from Envoy, so the client's next request finds the entry (or, inside a slow store's
        round trip, waits for it as a follower: still one model call). The embedded store's call
        is only CPU: it runs a turn later, once the answer is written. The lease goes with the
        task: the exchange's end has none left to hand on."""
        vector = f.vector.astype("float32").tobytes() if with_vector and f.vector is not None else None
        raw = entry.dump()
        ttl_ms, most = int(self.b.ttl_s(entry) * 1000), self.b.config.max_entries_per_scope
        token, f.token = f.token, None
        item = Put(f.q.scope, f.key, raw, ttl_ms, most, f.q.tenant, f.q.model, vector,
                   f.bands if vector else (), token)
        if self.b.tasks is None:
            await self._put(item, entry)
        else:
            self.b.tasks.spawn(self._put(item, entry, after_answer=self.b.guard.local), PUT_TASK)

    async def _put(self, item: Put, entry: Entry, after_answer: bool = False) -> None:
        b = self.b
        if after_answer:
            # This first step runs before the port writes the answer (queued in the same turn);
            # the next one runs after it.
            await asyncio.sleep(0)
        stored = await b.guard.run(_true(b.store.put(item)), False, "cache_put", b.op_timeout_s)
        b.metrics.cache_stores.labels("stored" if stored else "failed").inc()
        if stored:
            b.keep_hot(item.scope, item.key, entry, len(item.entry))
        if item.token is not None:
            await b.leases.finish(item.scope, item.key, item.token, item.entry, stored=stored)

    async def finish(self, f: Flight, entry: bytes | None, *, stored: bool) -> None:
        """Lead no more: followers get `entry` (or one of them takes over), the lease goes back."""
        token, f.token = f.token, None
        if token is not None:
            await self.b.leases.finish(f.q.scope, f.key, token, entry, stored=stored)

    async def done(self, ex: Exchange, f: Flight) -> None:
        """The exchange ended while this request still led: note a client that gave up waiting
        (its retry is then refused in vain), and hand the lead on."""
        if f.token is None:
            return
        if ex.status is None and ex.upstream_started is not None:
            waited_ms = round((time.perf_counter() - ex.upstream_started) * 1000)
            await self.b.guard.run(self.b.store.abandon(f.q.scope, f.key, waited_ms, ABANDONED_TTL_MS), None,
                                   "cache_abandon", self.b.op_timeout_s)
        await self.finish(f, None, stored=False)


async def _true(call: Coroutine[Any, Any, None]) -> bool:
    await call
    return True
