"""The pipeline: an ordered list of stages, each hook timed; a failing stage fails open."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

from .exchange import Exchange, Reply
from .metrics import Metrics
from .stages.base import Stage

log = logging.getLogger("llm_gate.pipeline")
T = TypeVar("T")


class Pipeline:
    def __init__(self, stages: list[Stage], handled_paths: list[str], metrics: Metrics) -> None:
        self.stages = stages
        self.handled_paths = frozenset(handled_paths)
        self.metrics = metrics

    def handles(self, path: str) -> bool:
        return path.split("?", 1)[0] in self.handled_paths

    async def on_headers(self, ex: Exchange) -> Reply | None:
        return await self._until_reply("headers", ex)

    async def on_request(self, ex: Exchange) -> Reply | None:
        return await self._until_reply("request", ex)

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        for stage in reversed(self.stages):
            await self._call(stage, "response", stage.on_response(ex, status, headers))

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        for stage in reversed(self.stages):
            await self._call(stage, "response_body", stage.on_response_body(ex, chunk, end))

    async def on_done(self, ex: Exchange) -> None:
        for stage in reversed(self.stages):
            await self._call(stage, "done", stage.on_done(ex))

    async def _until_reply(self, hook: str, ex: Exchange) -> Reply | None:
        for stage in self.stages:
            method = stage.on_headers if hook == "headers" else stage.on_request
            started = time.perf_counter()
            reply = await self._call(stage, hook, method(ex))
            self.metrics.stage_seconds.labels(stage.name, hook).observe(time.perf_counter() - started)
            if reply is not None:
                return reply
        return None

    async def _call(self, stage: Stage, hook: str, call: Awaitable[T]) -> T | None:
        """A stage that fails is skipped for this request: the request itself goes on."""
        try:
            return await call
        except Exception:
            log.exception("stage %s failed in %s; skipping it for this request", stage.name, hook)
            self.metrics.stage_errors.labels(stage.name, hook).inc()
            return None
