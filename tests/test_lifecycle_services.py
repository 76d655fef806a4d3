"""Services own their lifecycle: built and started in one place, closed in one place, and
every background task goes through `Tasks` (a bare `create_task` can vanish mid-flight and
lose its exception)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import redis.asyncio as aioredis

from extproc.app import build_pipeline
from extproc.cache.store import Put
from extproc.config import Config
from extproc.metrics import Metrics
from extproc.server import Session
from load.bench_hop import REQUEST, body_message, chat, one_request
from load.stack import RedisServer

ROOT = Path(__file__).resolve().parent.parent / "extproc"


def test_create_task_appears_only_in_the_tasks_module() -> None:
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.name == "tasks.py" or "gen" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "attr", None) or getattr(node, "id", None)
            if name in ("create_task", "ensure_future"):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")  # type: ignore[attr-defined]
    assert offenders == []


async def _clients(admin: aioredis.Redis) -> int:
    return len(await admin.client_list()) - 1  # less the admin connection itself


def test_services_built_started_used_and_closed_leave_redis_client_count_as_it_was() -> None:
    """20 rounds of build → start → traffic on every Redis client → close: CLIENT LIST ends
    where it started (the breaker's own client included)."""

    async def run(url: str) -> tuple[int, int, int]:
        admin = aioredis.Redis.from_url(url)
        before = await _clients(admin)
        peak = 0
        config = Config.model_validate(
            {"store": {"redis_url": url}, "breaker": {"enabled": True, "sync_interval_s": 0.05}}
        )
        for _ in range(20):
            pipeline = build_pipeline(config, Metrics())
            await pipeline.start()
            services = pipeline.services
            assert services is not None and services.breaker_client is not None
            await services.breaker_client.ping()
            await services.answers.lookup("scope", "key", None, 0)  # the request path's client
            await asyncio.sleep(0.12)  # the breaker's sync loop talks to Redis
            peak = max(peak, await _clients(admin))
            await pipeline.aclose()
        await asyncio.sleep(0.1)
        after = await _clients(admin)
        await admin.aclose()
        return before, peak, after

    server = RedisServer().start()
    try:
        before, peak, after = asyncio.run(run(server.url))
    finally:
        server.kill()
    assert peak > before  # the services really connected
    assert after == before


def test_a_gate_that_closes_lets_the_answers_being_stored_go_in() -> None:
    """An answer is stored beside its request; a close just after the answer went out waits for
    that store call instead of cancelling it, so the next process finds the answer in Redis."""

    async def run(url: str) -> str:
        config = Config.model_validate({"store": {"redis_url": url}})
        pipeline = build_pipeline(config, Metrics())
        await pipeline.start()
        assert pipeline.services is not None
        answers = pipeline.services.answers
        put = answers.put

        async def slow_put(item: Put) -> None:  # slower than the request, within its budget (100 ms)
            await asyncio.sleep(0.06)
            await put(item)

        answers.put = slow_put  # type: ignore[method-assign]
        await one_request(Session(pipeline), body_message("request_body", chat("kept at close?")))
        await pipeline.aclose()
        again = build_pipeline(config, Metrics())
        await again.start()
        session = Session(again)
        await session.handle(REQUEST)
        answer = (await session.handle(body_message("request_body", chat("kept at close?"))))[-1]
        await session.close()
        await again.aclose()
        return str(answer.WhichOneof("response"))

    server = RedisServer().start()
    try:
        assert asyncio.run(run(server.url)) == "immediate_response"  # a hit
    finally:
        server.kill()
