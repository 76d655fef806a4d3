"""The RateLimit stage: keys, answers and headers, and what happens when the store fails."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extproc.config import Caller, Config, Identity, parse_config
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.ratelimit.keys import client_ip, plan, prompt_fingerprint
from extproc.ratelimit.store import MemoryStore, RedisStore
from extproc.redis_wire import FastRedis
from extproc.stages.identity import Identity as IdentityStage
from extproc.stages.ratelimit import RateLimit, duration
from load.stack import RedisServer, free_port
from tests.services import guard

CHAT = "/v1/chat/completions"
CONFIG = """
ratelimit:
  tiers:
    standard: {tenant: {rate: 1, burst: 3}, user: {rate: 1, burst: 2}, ip: {rate: 100, burst: 100}}
    vip: {tenant: {rate: 100, burst: 50}}
  routes: {/v1/completions: {rate: 1, burst: 1}}
  repeat: {enabled: true, max_repeats: 3, window_s: 1, block_s: 30}
  fail_closed_paths: [/v1/completions]
"""


def chat(content: str = "hi") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


KEYS = {"sk-std": Caller(tenant="beta"), "sk-vip": Caller(tenant="acme", tier="vip")}


async def exchange(
    headers: dict[str, str], payload: dict[str, Any] | None = None, path: str = CHAT
) -> Exchange:
    identity = Identity(api_keys=KEYS)
    ex = Exchange("POST", path, {"x-forwarded-for": "203.0.113.7", **headers})
    assert await IdentityStage(identity).on_headers(ex) is None
    ex.payload = payload or chat()
    return ex


def stage(store: Any = None, text: str = CONFIG, op_timeout_ms: int = 50) -> RateLimit:
    config, metrics = parse_config(text), Metrics()
    budget = guard(metrics, op_timeout_ms=op_timeout_ms)
    return RateLimit(config.ratelimit, store or MemoryStore(), metrics, budget)


@pytest.mark.parametrize(
    ("xff", "hops", "ip"),
    [("", 0, None), ("1.1.1.1", 0, "1.1.1.1"), ("6.6.6.6, 1.1.1.1", 0, "1.1.1.1"),
     ("6.6.6.6,1.1.1.1, 10.0.0.2", 1, "1.1.1.1"), ("1.1.1.1", 3, "1.1.1.1")],
)
def test_client_ip_trusts_only_the_configured_hops(xff: str, hops: int, ip: str | None) -> None:
    assert client_ip({"x-forwarded-for": xff} if xff else {}, hops) == ip


def test_prompts_differing_only_in_case_and_spacing_are_the_same_prompt() -> None:
    a = prompt_fingerprint(chat("What is  the Capital of France?"))
    assert a == prompt_fingerprint(chat(" what is the capital of\nfrance? "))
    assert a != prompt_fingerprint(chat("What is the capital of Spain?"))
    assert prompt_fingerprint({"model": "m", "prompt": [[1, 2, 3]]}) is not None


async def test_keys_name_tenant_user_ip_and_route_but_never_the_api_key() -> None:
    ex = await exchange({"authorization": "Bearer sk-std", "x-user-id": "u1"})
    check = plan(parse_config(CONFIG).ratelimit, ex, "203.0.113.7", "fp")
    assert [b.name for b in check.buckets] == ["tenant", "user", "ip"]
    assert check.repeat is not None and check.repeat.block_key == "gate:rl:block:{beta/u1}"
    keys = " ".join([b.key for b in check.buckets] + [check.repeat.key, check.repeat.info])
    assert "sk-std" not in keys and "beta" in keys and "203.0.113.7" in keys


async def test_burst_then_429_in_openai_shape_with_ratelimit_headers() -> None:
    s = stage()
    oks = []
    for i in range(3):
        ex = await exchange({"authorization": "Bearer sk-std", "x-user-id": f"u{i}"}, chat(f"q{i}"))
        assert await s.on_request(ex) is None
        oks.append(ex.client_headers)
    assert [h["x-ratelimit-remaining-requests"] for h in oks] == ["1", "1", "0"]  # user, user, then tenant
    ex = await exchange({"authorization": "Bearer sk-std", "x-user-id": "u9"}, chat("q9"))
    reply = await s.on_request(ex)
    assert reply is not None and reply.status == 429
    error = orjson.loads(reply.body)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
    assert "per tenant (standard tier)" in error["message"]
    assert reply.headers["retry-after"] == "1" and reply.headers["x-ratelimit-limit-requests"] == "3"
    assert reply.headers["x-ratelimit-remaining-requests"] == "0"
    metric = s.metrics.registry.get_sample_value(
        "gate_ratelimit_decisions_total", {"result": "limited", "limit": "tenant", "tier": "standard"}
    )
    assert metric == 1


async def test_spoofed_priority_does_not_buy_vip_limits() -> None:
    s = stage()
    ex = await exchange({"authorization": "Bearer sk-std", "x-priority": "vip"})
    assert await s.on_request(ex) is None
    assert (ex.tier, ex.priority) == ("standard", "standard")
    assert ex.client_headers["x-ratelimit-limit-requests"] == "2"  # the standard user bucket
    vip = await exchange({"authorization": "Bearer sk-vip"})
    assert await s.on_request(vip) is None
    assert vip.client_headers["x-ratelimit-limit-requests"] == "50"


async def test_repeating_a_prompt_blocks_the_caller_for_any_prompt() -> None:
    s = stage(text="ratelimit: {repeat: {enabled: true, max_repeats: 3, window_s: 1, block_s: 30}}")
    for _ in range(3):
        assert await s.on_request(await exchange({"x-user-id": "spammer"}, chat("buy now"))) is None
    reply = await s.on_request(await exchange({"x-user-id": "spammer"}, chat("BUY  now")))
    assert reply is not None and reply.status == 429 and reply.headers["retry-after"] == "30"
    assert orjson.loads(reply.body)["error"]["code"] == "repeated_prompt_blocked"
    other = await s.on_request(await exchange({"x-user-id": "spammer"}, chat("something else")))
    assert other is not None and other.status == 429
    assert await s.on_request(await exchange({"x-user-id": "someone-else"}, chat("buy now"))) is None
    assert s.metrics.registry.get_sample_value("gate_ratelimit_blocks_total", {"tier": "standard"}) == 1
    assert [b.caller for b in await s.store.blocks()] == ["anonymous/spammer"]


async def test_store_down_skips_limits_or_fails_closed_where_configured() -> None:
    dead = FastRedis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.05)
    # A refused connection answers at once; the wide budget keeps a busy machine from turning
    # it into a time-out, which is counted under another name.
    s = stage(RedisStore(dead), op_timeout_ms=2000)
    ex = await exchange({"authorization": "Bearer sk-std"})
    assert await s.on_request(ex) is None
    assert "x-ratelimit-limit-requests" not in ex.client_headers
    closed = await s.on_request(await exchange({}, {"model": "m", "prompt": "x"}, "/v1/completions"))
    assert closed is not None and closed.status == 503
    assert orjson.loads(closed.body)["error"]["code"] == "ratelimit_unavailable"
    errors = s.metrics.registry.get_sample_value(
        "gate_store_errors_total", {"op": "ratelimit", "error": "ConnectionError"}
    )
    assert errors == 2
    await dead.aclose()


async def test_disabled_or_unconfigured_limits_cost_nothing() -> None:
    s = stage(text="ratelimit: {enabled: false}")
    ex = await exchange({})
    assert await s.on_request(ex) is None and ex.client_headers == {}
    memory = MemoryStore()
    default = RateLimit(Config().ratelimit, memory, Metrics(), guard(op_timeout_ms=50))
    for _ in range(20):
        ex = await exchange({})
        assert await default.on_request(ex) is None and ex.client_headers == {}
    assert memory.histories == {} and memory.tats == {}  # no limit configured, the repeat block off


@pytest.mark.parametrize(("us", "text"), [(20_000, "20ms"), (1, "1ms"), (1_500_000, "1.5s"),
                                          (59_000_000, "59s"), (360_000_000, "6m0s"), (61_500_000, "1m2s")])
def test_reset_durations_read_like_openai(us: int, text: str) -> None:
    assert duration(us) == text


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_client_reusing_its_request_id_is_still_charged_each_time(
    backend: str, redis_server: RedisServer
) -> None:
    """Verdicts are kept by the gate's own id per request, never by the x-request-id a client sends."""
    if backend == "redis":
        if redis_server.proc is None:
            redis_server.start()
        redis_server.flush()
        client = FastRedis.from_url(redis_server.url)
        s = stage(RedisStore(client))
    else:
        s = stage()
    statuses = []
    for i in range(4):
        ex = await exchange({"authorization": "Bearer sk-std", "x-request-id": "same-id"}, chat(f"q{i}"))
        ex.request_id = "same-id"
        reply = await s.on_request(ex)
        statuses.append(200 if reply is None else reply.status)
    if backend == "redis":
        await client.aclose()
    assert statuses == [200, 200, 429, 429]  # the user's burst of 2, whatever id the client sends
