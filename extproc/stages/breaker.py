"""Breaker: send new requests to the pool's fallback while its latency breaker is open.

Runs after Route and PromptLimit have chosen the pool; re-routes with `Route.send_to`
(cluster header and `model` rewrite), and times every upstream call of its own view:

- JSON: vLLM sends the headers after the last token, so time-to-headers is the total.
- Streams: the headers leave before the first token. `stream_signal: ttft` streams the
  response body through the gate (one ext_proc message per chunk) to time the first
  chunk; `total` times the end of the stream from `on_done`, which Envoy calls when the
  HTTP stream ends, at no extra cost.
- Outcomes: 5xx (Envoy's own 503/504 for resets and timeouts included) and a stream that
  ended with no response at all count as errors; 4xx are the caller's and are not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..breaker.monitor import Breakers
from ..config import Breaker as BreakerConfig
from ..config import Config, Routing
from ..errors import SHOULD_RETRY
from ..exchange import Exchange, Reply
from ..request import wants_stream
from .base import Stage, payload_of
from .route import Route

if TYPE_CHECKING:
    from ..services import Services




@dataclass
class Call:
    """What the breaker knows of one upstream call."""

    pool: str
    version: int
    stream: bool
    status: int | None = None
    headers_at: float | None = None
    first_chunk_at: float | None = None


def measure(call: Call, started: float, done_at: float, stream_signal: str) -> tuple[float | None, bool]:
    """(latency in seconds or None, error) for one finished call; (None, False): not a sample."""
    if call.status is None or call.headers_at is None:
        return None, True
    if call.status >= 500:
        return None, True
    if call.status >= 400:
        return None, False
    if not call.stream:
        return call.headers_at - started, False
    if stream_signal == "ttft" and call.first_chunk_at is not None:
        return call.first_chunk_at - started, False
    return done_at - started, False


class Breaker(Stage):
    name = "breaker"
    fail_closed = False
    store_down = "local state only"  # each process decides on its own windows until it is back

    def __init__(
        self, breakers: Breakers, routing: Routing, config: BreakerConfig, default_prompt_limit: int
    ) -> None:
        self.breakers = breakers
        self.routing = routing
        self.config = config
        self.default_prompt_limit = default_prompt_limit
        self.route = Route(routing)

    @classmethod
    def build(cls, config: Config, services: Services) -> Breaker:
        return cls(services.breakers, config.routing, config.breaker, config.validation.max_prompt_tokens)

    def runs(self, hook: str) -> bool:
        # Off, it still tells clients not to retry a model's 5xx.
        return self.config.enabled or hook == "on_response"

    async def on_request(self, ex: Exchange) -> Reply | None:
        if not self.config.enabled or ex.pool is None:
            return None
        payload = payload_of(ex)
        pool = ex.pool
        choice = self.breakers.choose(pool)
        fallback = self.routing.pools[pool].fallback
        if not choice.primary and fallback is not None and self._fits(ex, fallback):
            self.route.send_to(ex, fallback)
            self.breakers.metrics.breaker_reroutes.labels(pool, fallback).inc()
            pool, version = fallback, self.breakers.version(fallback)
        else:
            version = choice.version
        call = ex.state[self.name] = Call(pool, version, wants_stream(payload))
        self.breakers.begin(pool, ex.uid, version, lambda: self._waiting(ex, call))
        return None

    def _waiting(self, ex: Exchange, call: Call) -> float | None:
        """Seconds the call has waited for its first byte (None: not sent yet, or answered)."""
        if ex.upstream_started is None:
            return None
        first_chunk = call.stream and self.config.stream_signal == "ttft" and (call.status or 200) < 300
        answered = call.first_chunk_at is not None if first_chunk else call.headers_at is not None
        return None if answered else time.perf_counter() - ex.upstream_started

    def _fits(self, ex: Exchange, pool: str) -> bool:
        """A prompt the fallback cannot take stays on the slow primary rather than fail."""
        limit = self.routing.pools[pool].max_prompt_tokens or self.default_prompt_limit
        return ex.prompt_tokens <= limit

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        if ex.upstream_started is None:
            return  # the gate answered itself
        if status >= 500:
            # A model (or Envoy for it) failed this request; Envoy already retried what never
            # reached a model. A client retry would multiply calls to a failing pool (OpenAI's
            # SDKs retry 5xx twice): tell them not to.
            ex.client_headers[SHOULD_RETRY] = "false"
        call = ex.state.get(self.name)
        if not isinstance(call, Call):
            return
        call.status, call.headers_at = status, time.perf_counter()
        if call.stream and self.config.stream_signal == "ttft" and 200 <= status < 300:
            ex.capture_body = True

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        call = ex.state.get(self.name)
        if isinstance(call, Call) and call.first_chunk_at is None and chunk:
            call.first_chunk_at = time.perf_counter()

    async def on_done(self, ex: Exchange) -> None:
        call = ex.state.pop(self.name, None)
        if not isinstance(call, Call):
            return
        self.breakers.end(call.pool, ex.uid)
        if ex.upstream_started is None:
            return
        latency, error = measure(call, ex.upstream_started, time.perf_counter(), self.config.stream_signal)
        if latency is not None or error:
            self.breakers.record(call.pool, call.version, latency, error)
