"""The admission stage with the embedded queue, and with an unreachable scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from extproc.config import Config
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.scheduler.pools import Pools
from extproc.stages.admission import (
    Admission,
    answer_by_s,
    estimated_tokens,
    is_urgent,
    last_user_text,
    wait_budget_s,
)
from load.stack import free_port

DEFAULT_WORDS = Config().admission.urgency_words


def exchange(id: str, priority: str = "standard", content: str = "hello", **payload: Any) -> Exchange:
    ex = Exchange(method="POST", path="/v1/chat/completions", headers={}, request_id=id)
    ex.payload = {"model": "m", "messages": [{"role": "user", "content": content}], **payload}
    ex.pool, ex.priority, ex.prompt_tokens = "primary", priority, 5
    return ex


def admission(**section: Any) -> Admission:
    windows = {"batch_window_ms": {"vip": 0, "premium": 0, "standard": 0}}
    config = Config.model_validate({"admission": {**windows, **section}})
    metrics = Metrics()
    return Admission(config.admission, Pools(config.admission, metrics, config.server.workers), metrics)


@pytest.mark.parametrize(
    ("text", "urgent"),
    [
        ("请马上回复", True),
        ("这个很紧急", True),
        ("Please answer ASAP", True),
        ("URGENT: server down", True),
        ("tell me a story", False),
        ("立即", False),  # not in the default list
    ],
)
def test_urgency_words(text: str, urgent: bool) -> None:
    assert is_urgent(text, DEFAULT_WORDS) is urgent


def test_the_last_user_message_decides_urgency() -> None:
    payload = {
        "messages": [
            {"role": "user", "content": "urgent"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "thanks"},
        ]
    }
    assert last_user_text(payload) == "thanks"
    assert last_user_text({"prompt": "asap please"}) == "asap please"


def test_estimated_tokens_reserve_prompt_and_output() -> None:
    assert estimated_tokens({"max_tokens": 100}, 20, 256) == 120
    assert estimated_tokens({"max_completion_tokens": 50, "n": 2}, 20, 256) == 120
    assert estimated_tokens({}, 20, 256) == 276


async def test_full_pool_queues_then_sheds_with_an_overloaded_reply() -> None:
    stage = admission(max_queued=1, pools={"primary": {"capacity": {"static_limit": 1}}})
    first = exchange("first")
    assert await stage.on_request(first) is None
    assert "x-gate-queue-ms" in first.client_headers
    second = exchange("second", "vip")
    waiting = asyncio.create_task(stage.on_request(second))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    reply = await stage.on_request(exchange("third"))
    assert reply is not None and reply.status == 503
    error = orjson.loads(reply.body)["error"]
    assert error["type"] == "overloaded" and error["eta_ms"] >= 1 and "Retry after" in error["message"]
    assert int(reply.headers["retry-after"]) >= 1
    first.status = 200
    await stage.on_done(first)
    assert await asyncio.wait_for(waiting, 2) is None
    assert int(second.client_headers["x-gate-queue-ms"]) >= 40
    await stage.on_done(second)
    await stage.on_done(second)  # a second on_done releases nothing more
    assert stage.pools.embedded["primary"].status().in_flight == 0
    await stage.pools.embedded["primary"].stop()


async def test_a_client_that_goes_away_while_queued_frees_its_place() -> None:
    stage = admission(pools={"primary": {"capacity": {"static_limit": 1}}})
    held = exchange("held")
    await stage.on_request(held)
    gone = exchange("gone")
    waiting = asyncio.create_task(stage.on_request(gone))
    await asyncio.sleep(0.02)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await stage.on_done(gone)
    local = stage.pools.embedded["primary"]
    assert sum(local.status().queued.values()) == 0
    await stage.on_done(held)
    assert local.status().in_flight == 0
    await local.stop()


async def test_unreachable_scheduler_admits_without_queueing() -> None:
    stage = admission(pools={"primary": {"scheduler": f"127.0.0.1:{free_port()}"}})
    ex = exchange("a")
    assert await stage.on_request(ex) is None
    assert "x-gate-queue-ms" not in ex.client_headers
    assert stage.metrics.admission.labels("primary", "fail_open")._value.get() == 1
    await stage.on_done(ex)


async def test_disabled_admission_does_nothing() -> None:
    stage = admission(enabled=False)
    assert await stage.on_request(exchange("a")) is None
    assert not stage.pools.embedded


async def test_a_request_that_cannot_make_its_budget_is_told_at_once_not_at_its_deadline() -> None:
    stage = admission(
        pools={"primary": {"capacity": {"static_limit": 1}}},
        deadline_ms={"vip": 60_000, "premium": 60_000, "standard": 2_000},
    )
    warm = exchange("warm")
    await stage.on_request(warm)
    await asyncio.sleep(0.1)  # a slot is held ~0.1 s: the pool's service time
    warm.status = 200
    await stage.on_done(warm)
    held = exchange("held")
    await stage.on_request(held)
    ahead = [asyncio.create_task(stage.on_request(exchange(f"v{i}", "vip"))) for i in range(25)]
    await asyncio.sleep(0.01)
    # 26 releases of ~0.1 s ahead of it, 2 s allowed: the 503 comes now, while nothing is released.
    reply = await asyncio.wait_for(stage.on_request(exchange("late")), 1.0)
    assert reply is not None and reply.status == 503
    error = orjson.loads(reply.body)["error"]
    assert error["eta_ms"] > 2_000 and int(reply.headers["retry-after"]) >= 2
    assert not any(t.done() for t in ahead)
    for t in ahead:
        t.cancel()
    await asyncio.gather(*ahead, return_exceptions=True)
    await stage.on_done(held)
    await stage.pools.embedded["primary"].stop()


@pytest.mark.parametrize(
    ("header", "budget"),
    [(None, 10.0), ("4", 2.0), ("600", 10.0), ("0", 10.0), ("nan", 10.0), ("soon", 10.0)],
)
def test_a_request_never_queues_past_half_its_clients_timeout(header: str | None, budget: float) -> None:
    headers = {} if header is None else {"x-stainless-read-timeout": header}
    assert wait_budget_s(10.0, headers) == budget


@pytest.mark.parametrize(
    ("stream", "header", "answer_by"),
    [(False, "5", 5.0), (True, "5", None), (False, None, None), (False, "soon", None)],
)
def test_a_json_answer_must_reach_its_client_before_its_timeout(
    stream: bool, header: str | None, answer_by: float | None
) -> None:
    """A whole JSON answer must arrive within the client's read timeout; a stream's first token."""
    headers = {} if header is None else {"x-stainless-read-timeout": header}
    assert answer_by_s({"stream": stream}, headers) == answer_by


async def test_on_a_preempting_pool_vip_goes_over_the_limit_and_every_request_carries_its_priority() -> None:
    """One slot, one over the limit for vip: a vip request is granted while a standard one
    runs, and the model server is told each request's priority (the client's own replaced)."""
    stage = admission(pools={"primary": {"capacity": {"static_limit": 1}, "preempt_slots": 1}})
    running, vip = exchange("running"), exchange("vip", "vip")
    for ex, claimed in ((running, 100), (vip, -5)):
        assert ex.payload is not None
        ex.payload["priority"] = claimed
    assert await stage.on_request(running) is None
    assert await asyncio.wait_for(stage.on_request(vip), 1.0) is None
    sent = [orjson.loads(ex.upstream_body or b"{}") for ex in (running, vip)]
    assert [body["priority"] for body in sent] == [2, 0]
    waiting = asyncio.create_task(stage.on_request(exchange("standard")))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # the slot over the limit is vip's only
    await stage.on_done(running)
    await asyncio.sleep(0.05)
    assert not waiting.done()  # one slot, held by vip
    await stage.on_done(vip)
    assert await asyncio.wait_for(waiting, 1.0) is None


async def test_a_pool_that_does_not_preempt_gets_no_priority_and_no_slot_over_the_limit() -> None:
    stage = admission(pools={"primary": {"capacity": {"static_limit": 1}}})
    running = exchange("running")
    assert await stage.on_request(running) is None
    assert running.upstream_body is None
    vip = asyncio.create_task(stage.on_request(exchange("vip", "vip")))
    await asyncio.sleep(0.1)
    assert not vip.done()
    await stage.on_done(running)
    assert await asyncio.wait_for(vip, 1.0) is None
