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


async def push_samples(url: str, age_s: float) -> None:
    client = aioredis.Redis.from_url(url)
    part = Slice()
    for _ in range(19):
        part.add(0.2, error=False)
    part.add(None, error=True)
    index = Window(60, 20).index(time.time() - age_s)
    await shared.push(client, "gate:breaker:", "primary", {index: part}, 60)
    await client.aclose()


def test_status_reads_the_window_merged_in_redis(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    redis_server.flush()
    # Samples from 10 s ago, with no state stored yet (no transition so far): the gate
    # counts them, so the operator sees them too.
    asyncio.run(push_samples(redis_server.url, age_s=10))
    assert cli(["breaker", "status", "--redis", redis_server.url, "--json"]) == 0
    row = next(r for r in orjson.loads(capsys.readouterr().out) if r["pool"] == "primary")
    assert row["samples"] == 20 and row["error_rate"] == 0.05 and 0.2 <= row["p95_s"] < 0.23
    assert row["state"] == "closed" and row["for_s"] is None
    assert cli(["breaker", "status", "--redis", redis_server.url]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("primary"))
    assert line.split()[1:3] == ["closed", "-"] and "no state yet" in line


def test_unreachable_redis_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["breaker", "status", "--redis", "redis://127.0.0.1:9/0"]) == 1
    assert "cannot reach Redis" in capsys.readouterr().err
