"""Token budgets: one table run against the memory store and a real redis-server, then the stage."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from extproc.config import Config
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.ratelimit.gcra import US
from extproc.redis_wire import FastRedis
from extproc.scheduler.budget import Budget, BudgetStore, MemoryBudgets, RedisBudgets
from extproc.stages.token_budget import TokenBudget, used_tokens
from load.stack import RedisServer
from tests.services import guard

T0 = 1_700_000_000 * US
# (seconds after T0, op, tokens) → expected (allowed, remaining) for takes; give-backs return nothing.
SCRIPT: list[tuple[float, str, int, tuple[bool, int] | None]] = [
    (0.0, "take", 400, (True, 600)),
    (0.0, "take", 500, (True, 100)),
    (0.0, "take", 200, (False, 100)),  # a refusal takes nothing
    (0.0, "back", 150, None),  # 150 reserved but not used
    (0.0, "take", 200, (True, 50)),
    (6.0, "take", 100, (True, 50)),  # 6 s refill 100 tokens at 1000/min
    (66.0, "take", 1000, (True, 0)),  # full again (50 left at 6 s, 57 s to refill)
    (66.0, "take", 1, (False, 0)),
    (66.0, "back", 5000, None),  # never above full
    (66.0, "take", 1001, (False, 1000)),  # more than the whole budget
]


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[BudgetStore]:
    if request.param == "memory":
        yield MemoryBudgets()
        return
    client = FastRedis.from_url(redis_server.url)
    yield RedisBudgets(client)
    await client.aclose()


async def test_budget_script_on_both_stores(store: BudgetStore) -> None:
    budget = Budget(f"tb:{uuid.uuid4().hex}", per_minute=1000)
    for at, op, tokens, expected in SCRIPT:
        now = T0 + int(at * US)
        if op == "back":
            await store.give_back(budget, tokens, now)
            continue
        decision = await store.take(budget, tokens, now)
        assert (decision.allowed, decision.remaining) == expected, (at, op, tokens)
        if not decision.allowed:
            assert decision.retry_after > 0


@pytest.mark.parametrize(
    ("tail", "used"),
    [
        (b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}', 12),
        (b'data: {"choices":[],"usage":{"total_tokens":30}}\n\ndata: [DONE]\n\n', 30),
        (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n', None),
    ],
)
def test_usage_is_read_from_json_and_sse_tails(tail: bytes, used: int | None) -> None:
    assert used_tokens(tail) == used


def exchange(tenant: str = "acme", max_tokens: int = 100) -> Exchange:
    ex = Exchange(method="POST", path="/v1/chat/completions", headers={})
    ex.payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    ex.tenant, ex.prompt_tokens = tenant, 20
    return ex


def stage(per_minute: dict[str, int], store: BudgetStore | None = None, **extra: Any) -> TokenBudget:
    config = Config.model_validate(
        {"admission": {"token_budget": {"tokens_per_minute": per_minute, **extra}}}
    )
    return TokenBudget(config.admission, store or MemoryBudgets(), Metrics(), guard(op_timeout_ms=50))


async def test_exhausted_budget_is_a_429_with_token_headers() -> None:
    s = stage({"acme": 200})
    first = exchange()
    assert await s.on_request(first) is None
    assert first.client_headers["x-ratelimit-remaining-tokens"] == "80"
    reply = await s.on_request(exchange())
    assert reply is not None and reply.status == 429
    error = orjson.loads(reply.body)["error"]
    assert error["type"] == "tokens" and error["code"] == "rate_limit_exceeded"
    assert "200 tokens per minute" in error["message"]
    assert reply.headers["x-ratelimit-limit-tokens"] == "200"
    assert int(reply.headers["retry-after"]) >= 1
    assert await s.on_request(exchange("other-tenant")) is None  # no budget configured: unlimited


async def test_usage_gives_back_what_was_not_used_and_failures_give_back_all() -> None:
    s = stage({"*": 300})
    ok = exchange()  # reserves 120
    await s.on_request(ok)
    await s.on_response(ok, 200, {})
    assert ok.capture_body
    await s.on_response_body(ok, b'{"usage": {"total_tokens": 40}}', True)  # 80 back
    failed = exchange()
    await s.on_request(failed)
    await s.on_response(failed, 503, {})  # all 120 back
    await s.on_done(failed)
    probe = exchange(max_tokens=200)  # 220 fit only if both were given back: 300 - 40
    assert await s.on_request(probe) is None


async def test_a_failing_store_skips_the_budget() -> None:
    dead = aioredis.Redis(port=1, socket_connect_timeout=0.05)
    s = stage({"*": 1}, RedisBudgets(dead))
    assert await s.on_request(exchange()) is None
    assert s.metrics.token_budget.labels("skipped")._value.get() == 1
    await dead.aclose()


@pytest.mark.parametrize("inject", [False, True])
async def test_include_usage_is_asked_for_only_when_configured(inject: bool) -> None:
    s = stage({"*": 10_000}, inject_include_usage=inject)
    streamed = exchange()
    assert streamed.payload is not None
    streamed.payload["stream"] = True
    await s.on_request(streamed)
    if inject:
        assert streamed.upstream_body is not None
        assert orjson.loads(streamed.upstream_body)["stream_options"] == {"include_usage": True}
    else:
        assert streamed.upstream_body is None
    plain = exchange()
    await s.on_request(plain)
    assert plain.upstream_body is None  # JSON answers carry usage anyway
