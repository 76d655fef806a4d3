"""The pipeline: an ordered list of stages, each hook timed; a failing stage fails open."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .exchange import Exchange, Reply
from .metrics import Metrics
from .stages.base import Stage

log = logging.getLogger("llm_gate.pipeline")
T = TypeVar("T")
HOOKS = ("on_headers", "on_request", "on_response", "on_response_body", "on_done")


class Pipeline:
    def __init__(
        self, stages: list[Stage], handled_paths: list[str], metrics: Metrics, redis: Any = None
    ) -> None:
        self.stages = stages
        self.handled_paths = frozenset(handled_paths)
        self.metrics = metrics
        self.redis = redis  # the process's store client, closed with the pipeline
        self.active = 0  # open streams on this pipeline (a retired one closes when it reaches 0)
        # Per hook, only the stages that implement it: a request never awaits a no-op.
        self._hooks = {
            hook: [s for s in stages if getattr(type(s), hook) is not getattr(Stage, hook)] for hook in HOOKS
        }
        self._timers = {
            (s.name, hook): metrics.stage_seconds.labels(s.name, hook.removeprefix("on_"))
            for s in stages
            for hook in ("on_headers", "on_request")
        }

    def handles(self, path: str) -> bool:
        return path.split("?", 1)[0] in self.handled_paths

    async def on_headers(self, ex: Exchange) -> Reply | None:
        return await self._until_reply("on_headers", ex)

    async def on_request(self, ex: Exchange) -> Reply | None:
        return await self._until_reply("on_request", ex)

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        for stage in reversed(self._hooks["on_response"]):
            await self._call(stage, "on_response", stage.on_response(ex, status, headers))

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        for stage in reversed(self._hooks["on_response_body"]):
            await self._call(stage, "on_response_body", stage.on_response_body(ex, chunk, end))

    async def on_done(self, ex: Exchange) -> None:
        for stage in reversed(self._hooks["on_done"]):
            await self._call(stage, "on_done", stage.on_done(ex))

    async def aclose(self) -> None:
        """Retire the pipeline: every stage's background work and the store client stop."""
        for stage in self.stages:
            try:
                await stage.aclose()
            except Exception:
                log.exception("stage %s failed to close", stage.name)
        if self.redis is not None:
            await self.redis.aclose()

    async def _until_reply(self, hook: str, ex: Exchange) -> Reply | None:
        for stage in self._hooks[hook]:
            method: Callable[[Exchange], Awaitable[Reply | None]] = getattr(stage, hook)
            started = time.perf_counter()
            reply = await self._call(stage, hook, method(ex))
            self._timers[stage.name, hook].observe(time.perf_counter() - started)
            if reply is not None:
                return reply
        return None

    async def _call(self, stage: Stage, hook: str, call: Awaitable[T]) -> T | None:
        """A stage that fails is skipped for this request: the request itself goes on."""
        try:
            return await call
        except Exception:
            log.exception("stage %s failed in %s; skipping it for this request", stage.name, hook)
            self.metrics.stage_errors.labels(stage.name, hook.removeprefix("on_")).inc()
            return None
