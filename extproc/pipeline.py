"""The pipeline: an ordered list of stages, each hook timed."""

from __future__ import annotations

import logging
import time

from .exchange import Exchange, Reply
from .metrics import Metrics
from .stages.base import Stage

log = logging.getLogger("llm_gate.pipeline")


class Pipeline:
    def __init__(self, stages: list[Stage], handled_paths: list[str], metrics: Metrics) -> None:
        self.stages = stages
        self.handled_paths = frozenset(handled_paths)
        self.metrics = metrics

    def handles(self, path: str) -> bool:
        return path.split("?", 1)[0] in self.handled_paths

    async def on_headers(self, ex: Exchange) -> Reply | None:
        for stage in self.stages:
            started = time.perf_counter()
            reply = await stage.on_headers(ex)
            self._observe(stage, "headers", started)
            if reply is not None:
                return reply
        return None

    async def on_request(self, ex: Exchange) -> Reply | None:
        for stage in self.stages:
            started = time.perf_counter()
            reply = await stage.on_request(ex)
            self._observe(stage, "request", started)
            if reply is not None:
                return reply
        return None

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        for stage in reversed(self.stages):
            await stage.on_response(ex, status, headers)

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        for stage in reversed(self.stages):
            await stage.on_response_body(ex, chunk, end)

    async def on_done(self, ex: Exchange) -> None:
        """Every stage gets its `on_done`, even when an earlier one fails."""
        for stage in reversed(self.stages):
            try:
                await stage.on_done(ex)
            except Exception:
                log.exception("stage %s failed to clean up", stage.name)

    def _observe(self, stage: Stage, hook: str, started: float) -> None:
        self.metrics.stage_seconds.labels(stage.name, hook).observe(time.perf_counter() - started)
