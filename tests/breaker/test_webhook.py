"""Webhook delivery against a real local HTTP receiver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from extproc.breaker.webhook import Notifier, backoff_delays
from extproc.config import Webhook
from extproc.metrics import Metrics


class Receiver:
    def __init__(self, fail_first: int = 0, hang: bool = False) -> None:
        self.fail_first, self.hang = fail_first, hang
        self.calls = 0
        self.got: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.hang:
            await asyncio.sleep(30)
        if self.calls <= self.fail_first:
            return web.Response(status=503)
        self.got.append(await request.json())
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        return web.Response(status=204)


async def serve(receiver: Receiver) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/hook"


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[Receiver, str]]:
    receiver = Receiver(fail_first=2)
    runner, url = await serve(receiver)
    yield receiver, url
    await runner.cleanup()


def test_backoff_doubles_with_jitter() -> None:
    assert backoff_delays(3, 0.5, lambda: 1.0) == [0.5, 1.0, 2.0]
    assert backoff_delays(3, 0.5, lambda: 0.0) == [0.25, 0.5, 1.0]


async def test_notice_is_retried_until_delivered(flaky: tuple[Receiver, str]) -> None:
    receiver, url = flaky
    metrics = Metrics()
    notifier = Notifier(Webhook(url=url, backoff_s=0.01, headers={"authorization": "Bearer t"}), metrics)
    started = time.perf_counter()
    notifier.notify({"pool": "primary", "old_state": "closed", "new_state": "open"})
    assert time.perf_counter() - started < 0.05  # returns at once: never on the request path
    await notifier.tasks.wait(5)
    assert receiver.calls == 3
    assert receiver.got == [{"pool": "primary", "old_state": "closed", "new_state": "open"}]
    assert receiver.headers[0]["authorization"] == "Bearer t"
    assert metrics.registry.get_sample_value("gate_breaker_webhooks_total", {"result": "delivered"}) == 1
    await notifier.close()


async def test_a_receiver_that_never_answers_costs_at_most_the_deadline() -> None:
    receiver = Receiver(hang=True)
    runner, url = await serve(receiver)
    metrics = Metrics()
    notifier = Notifier(Webhook(url=url, timeout_s=0.2, retries=10, backoff_s=0.05, deadline_s=0.6), metrics)
    started = time.perf_counter()
    assert await notifier.deliver({"pool": "p"}) is False
    assert time.perf_counter() - started < 2.0
    assert metrics.registry.get_sample_value("gate_breaker_webhooks_total", {"result": "failed"}) == 1
    await notifier.close()
    await runner.cleanup()


async def test_unreachable_receiver_fails_quietly() -> None:
    metrics = Metrics()
    notifier = Notifier(Webhook(url="http://127.0.0.1:9/hook", retries=1, backoff_s=0.01), metrics)
    assert await notifier.deliver({"pool": "p"}) is False
    await notifier.close()
