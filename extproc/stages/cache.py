"""Dedup: answer a question already answered (word for word, near-exact or by meaning), and
let identical requests in flight wait for one answer instead of each calling the model.

The stage wires two jobs: finding an answer (`cache/lookup.py`: the exact key, the process's
hot copy first, then by meaning, then a paraphrase in flight) and keeping a miss's answer
(`cache/keeper.py`: captured, stored, handed to the followers). A hit is an immediate
response and nothing after this stage runs. While the store is up, its calls wait within
their budget; when it is down, or one call fails, the request skips the cache and flows on.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..cache.backing import Backing, StoreDownError
from ..cache.flight import Flight
from ..cache.keeper import CHECK, Keeper
from ..cache.keys import exact_key, question
from ..cache.lookup import Finder, Found
from ..cache.replay import replay
from ..cache.rules import access
from ..cache.selfcheck import CHECK_HEADER_VALUE
from ..config import Config
from ..dedup.canonical import canonical
from ..errors import SHOULD_RETRY, error_reply
from ..exchange import Exchange, Reply, new_id
from ..request import client_timeout_s, wants_stream, wants_usage
from .base import Stage, payload_of

if TYPE_CHECKING:
    from ..services import Services

CACHE_HEADER = "x-gate-cache"
SIMILARITY_HEADER = "x-gate-similarity"
MATCH_HEADER = "x-gate-cache-match"
KEY_HEADER = "x-gate-cache-key"
RETRY_COUNT_HEADER = "x-stainless-retry-count"  # OpenAI's SDKs: 0 on the first attempt


class Cache(Stage):
    name = "cache"
    fail_closed = False
    store_down = "skipped"  # no hits, no coalescing: every request goes to the model

    def __init__(self, backing: Backing, finder: Finder, keeper: Keeper) -> None:
        self.b = backing
        self.config = backing.config
        self.finder = finder
        self.keeper = keeper

    @classmethod
    def build(cls, config: Config, services: Services) -> Cache:
        admission, c = config.admission, config.cache

        def may_wait_s(ex: Exchange) -> float:
            return admission.deadline_s(ex.priority) if admission.enabled else c.coalesce.max_wait_s

        backing = Backing(
            c, services.answers, services.store, services.leases, services.metrics, hot=services.hot,
            selfcheck=services.selfcheck, tasks=services.tasks,
            op_timeout_s=c.op_timeout_ms / 1000 if c.op_timeout_ms is not None else None,
        )
        keeper = Keeper(backing, services.tokens.count)
        return cls(backing, Finder(backing, keeper, services.matchers, may_wait_s), keeper)

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
        q = question(payload, ex.route_path, ex.tenant, self.config.shared_across_tenants, ex.cache_version)
        f = Flight(q, exact_key(q, canonical), acc, wants_stream(payload), wants_usage(payload))
        ex.state[self.name] = f
        try:
            if acc.lookup and acc.store:
                reply = await self._retry_in_vain(ex, f)
                if reply is not None:
                    return reply
            found = await self.finder.find(ex, f)
        except StoreDownError:
            # Its answer is not kept; a lease it took goes back when the exchange ends.
            f.access = replace(f.access, store=False)
            self._outcome(ex, "skipped")
            return None
        if found is not None:
            return self._serve(ex, f, found)
        self._outcome(ex, CHECK_HEADER_VALUE if CHECK in ex.state else "miss")
        self.finder.announce(f)
        return None

    async def _retry_in_vain(self, ex: Exchange, f: Flight) -> Reply | None:
        """A client's retry of a request whose last attempt it gave up on, after at least as
        long as it will wait now: the model takes longer than the client's timeout, and this
        attempt would only cost another model call that nobody reads. Only OpenAI's SDKs say
        both (x-stainless-retry-count, x-stainless-read-timeout)."""
        timeout_s = client_timeout_s(ex.headers)
        if timeout_s is None or ex.headers.get(RETRY_COUNT_HEADER, "0") in ("", "0"):
            return None
        waited_ms = await self.finder.gave_up_ms(f)
        if waited_ms is None or waited_ms < timeout_s * 1000 * 0.9:
            return None
        self.b.metrics.cache_requests.labels("retry_refused").inc()
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
        self.b.metrics.cache_requests.labels(result).inc()
        ex.client_headers[CACHE_HEADER] = "bypass" if result == "skipped" else result

    def _serve(self, ex: Exchange, f: Flight, found: Found) -> Reply:
        chat = ex.route_path.endswith("/chat/completions")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{new_id()}"
        ctype, body = replay(found.entry, f.stream, f.include_usage, rid, int(time.time()))
        f.served = True
        metrics = self.b.metrics
        metrics.cache_requests.labels(found.result).inc()
        metrics.cache_hits.labels(found.kind).inc()
        if found.kind == "semantic":
            metrics.cache_similarity.observe(found.similarity)
        headers = {"content-type": ctype, CACHE_HEADER: found.result,
                   SIMILARITY_HEADER: f"{found.similarity:.4f}", MATCH_HEADER: found.kind,
                   KEY_HEADER: f"{f.q.scope}.{found.key}"}
        return Reply(200, body, headers, decision="cache_hit" if found.result == "hit" else "coalesced")

    # ------------------------------------------------------------------ response

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        f = ex.state.get(self.name)
        if isinstance(f, Flight) and not f.served:
            await self.keeper.headers(ex, f, status, headers)

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        f = ex.state.get(self.name)
        if isinstance(f, Flight):
            await self.keeper.body(ex, f, chunk, end)

    async def on_done(self, ex: Exchange) -> None:
        f = ex.state.get(self.name)
        if isinstance(f, Flight):
            await self.keeper.done(ex, f)
