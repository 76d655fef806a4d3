"""The pipeline: an ordered list of stages, each hook timed, each failure met by its stage's policy.

A stage that fails unexpectedly is counted in `gate_stage_errors_total`. A fail-closed
stage (identity, validation, limits) then answers a JSON 500 with the request id: a check
that could not run must not wave the request through; one that checks answers (the
guardrail) has the answer withheld the same way. Any other stage is skipped for that
request, which goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from .access import log_access
from .config import Config
from .errors import error_reply
from .exchange import Exchange, Reply
from .metrics import Metrics
from .stages.base import Stage
from .tracing import Tracing

if TYPE_CHECKING:
    from .services import Services

log = logging.getLogger("llm_gate.pipeline")
T = TypeVar("T")
HOOKS = ("on_headers", "on_request", "on_response", "on_response_body", "on_done")
WORK_MARGIN_S = 5.0  # the stages' own work on top of the waits, under load


class Pipeline:
    def __init__(
        self, stages: list[Stage], config: Config, metrics: Metrics, services: Services | None = None
    ) -> None:
        self.stages = stages
        self.config = config
        self.handled_paths = frozenset(config.routing.handled_paths)
        self.passthrough = frozenset(tuple(e.split()) for e in config.routing.passthrough)
        self.metrics = metrics
        self.services = services  # closed with the pipeline
        self.tracing = services.tracing if services is not None else Tracing()
        self.active = 0  # open streams on this pipeline (a retired one closes when it reaches 0)
        # Per hook, only the stages that implement it and can act under this config: a request
        # never awaits a no-op.
        self._hooks = {
            hook: [s for s in stages if getattr(type(s), hook) is not getattr(Stage, hook) and s.runs(hook)]
            for hook in HOOKS
        }
        # The request hooks, bound once with their timers: (stage, hook, its timer).
        self._timed = {
            hook: [(s, getattr(s, hook), metrics.stage_seconds.labels(s.name, hook.removeprefix("on_")))
                   for s in self._hooks[hook]]
            for hook in ("on_headers", "on_request")
        }

    def handles(self, path: str) -> bool:
        return path.split("?", 1)[0] in self.handled_paths

    def passes(self, method: str, path: str) -> bool:
        """Whether a request the gate does not handle may go to a model server untouched."""
        return (method, path.split("?", 1)[0]) in self.passthrough

    def longer_timeout_s(self, ex: Exchange) -> float | None:
        """How long Envoy should wait for this request's answer, when longer than its
        message timeout: it may wait for a leader's answer and then for a slot."""
        c, s = self.config, self.config.server
        queue = c.admission.deadline_s(ex.priority) if c.admission.enabled else 0.0
        coalesce = c.cache.enabled and c.cache.coalesce.enabled
        follow = min(c.cache.coalesce.max_wait_s, queue or c.cache.coalesce.max_wait_s) if coalesce else 0.0
        needed = queue + follow + WORK_MARGIN_S
        if needed <= s.envoy_message_timeout_ms / 1000:
            return None
        return min(needed, s.envoy_max_message_timeout_ms / 1000)

    def log_request(self, ex: Exchange, busy_s: float) -> None:
        self.metrics.own_latency.observe(max(busy_s - ex.waited_s, 0.0))
        self.tracing.end(ex)
        if self.config.server.access_log:
            log_access(ex, busy_s)

    async def on_headers(self, ex: Exchange) -> Reply | None:
        return await self._until_reply("on_headers", ex)

    async def on_request(self, ex: Exchange) -> Reply | None:
        return await self._until_reply("on_request", ex)

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> Reply | None:
        """None: the answer goes on. A reply: a fail-closed stage could not check the answer
        (the guardrail), which is withheld and the client gets this instead."""
        for stage in reversed(self._hooks["on_response"]):
            try:
                await stage.on_response(ex, status, headers)
            except Exception:
                reply = self._failed(stage, "on_response", ex)
                if reply is not None:
                    return reply
        return None

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        for stage in reversed(self._hooks["on_response_body"]):
            await self._call(stage, "on_response_body", stage.on_response_body(ex, chunk, end))

    async def on_done(self, ex: Exchange) -> None:
        for stage in reversed(self._hooks["on_done"]):
            await self._call(stage, "on_done", stage.on_done(ex))

    async def start(self) -> None:
        """Start the services' background loops (in the running event loop)."""
        if self.services is not None:
            await self.services.start()

    async def aclose(self) -> None:
        """Retire the pipeline: the services it was built on stop and close."""
        if self.services is not None:
            await self.services.aclose()

    async def _until_reply(self, hook: str, ex: Exchange) -> Reply | None:
        tracing = self.tracing if self.tracing.enabled else None
        if tracing is not None and hook == "on_headers":
            tracing.begin(ex)
        method: Callable[[Exchange], Awaitable[Reply | None]]
        for stage, method, timer in self._timed[hook]:
            started = time.perf_counter()
            try:
                if tracing is None:
                    reply = await method(ex)
                else:
                    with tracing.stage(ex, stage.name, hook):
                        reply = await method(ex)
            except Exception:
                reply = self._failed(stage, hook, ex)
            timer.observe(time.perf_counter() - started)
            if reply is not None:
                return reply
        return None

    def _failed(self, stage: Stage, hook: str, ex: Exchange) -> Reply | None:
        policy = "answering 500" if stage.fail_closed else "skipping it for this request"
        log.exception("stage %s failed in %s (request %s); %s", stage.name, hook, ex.request_id, policy)
        self.metrics.stage_errors.labels(stage.name, hook.removeprefix("on_")).inc()
        if not stage.fail_closed:
            return None
        what = "the answer was withheld" if hook == "on_response" else "the request was not sent on"
        return error_reply(
            500,
            f"The gate could not complete its '{stage.name}' check, so {what}. "
            f"Retry; if it persists, give the operator request id {ex.request_id}.",
            type="server_error",
            code="gate_error",
            decision="gate_error",
        )

    async def _call(self, stage: Stage, hook: str, call: Awaitable[T]) -> T | None:
        """After the request went on nothing can be refused: a failing hook is only counted."""
        try:
            return await call
        except Exception:
            log.exception("stage %s failed in %s", stage.name, hook)
            self.metrics.stage_errors.labels(stage.name, hook.removeprefix("on_")).inc()
            return None
