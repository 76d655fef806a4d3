"""The operator's view: `llm-gate breaker status|force` against a real Redis."""

from __future__ import annotations

import time

import orjson
import pytest
import redis.asyncio as aioredis

from extproc.breaker import shared
from extproc.breaker.window import Slice, Window
from extproc.cli import main as cli
from load.stack import RedisServer


def test_force_then_status_shows_the_shared_state(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    redis_server.flush()
    assert cli(["breaker", "force", "primary", "open", "--redis", redis_server.url]) == 0
    assert "primary: open (version 0)" in capsys.readouterr().out
    assert cli(["breaker", "status", "--redis", redis_server.url, "--json"]) == 0
    rows = {r["pool"]: r for r in orjson.loads(capsys.readouterr().out)}
    assert rows["primary"]["state"] == "open" and rows["primary"]["reason"] == "forced by an operator"
    assert rows["fallback"]["state"] == "closed" and rows["primary"]["fallback"] == "fallback"
    assert cli(["breaker", "status", "--redis", redis_server.url]) == 0
    assert "forced by an operator" in capsys.readouterr().out


async def push_samples(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    part = Slice()
    for _ in range(19):
        part.add(0.2, error=False)
    part.add(None, error=True)
    await shared.push(client, "gate:breaker:", "primary", {Window(60, 20).index(time.time()): part}, 60)
    await client.aclose()


def test_status_reads_the_window_merged_in_redis(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    redis_server.flush()
    asyncio.run(push_samples(redis_server.url))
    assert cli(["breaker", "status", "--redis", redis_server.url, "--json"]) == 0
    row = next(r for r in orjson.loads(capsys.readouterr().out) if r["pool"] == "primary")
    assert row["samples"] == 20 and row["error_rate"] == 0.05 and 0.2 <= row["p95_s"] < 0.23
    assert row["state"] == "closed"


def test_unreachable_redis_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["breaker", "status", "--redis", "redis://127.0.0.1:9/0"]) == 1
    assert "cannot reach Redis" in capsys.readouterr().err
