"""Admission through a real Envoy: a pool held at twice its capacity, and a scheduler that dies.

The fuller measurement is `python -m load.bench_admission` (load/results/admission.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import httpx

from load.bench_admission import (
    SIM_ARGS,
    Result,
    by_class,
    mixed_load,
    quantile,
    scrape,
    sequential,
    stack_for,
    start_scheduler,
)
from load.stack import Stack, free_port


def settles(condition: Callable[[], bool], within_s: float = 10.0) -> bool:
    """Whether `condition` holds within `within_s` (it is polled, not timed)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def served(stack: Stack) -> int:
    return int(httpx.get(stack.sim_url("primary") + "/admin/state").json()["served"])


def test_vip_stays_fast_while_standard_absorbs_the_overload() -> None:
    deadlines = {"vip": 10_000, "premium": 6_000, "standard": 3_000}
    with stack_for(free_port(), deadline_ms=deadlines) as stack:
        unloaded = [r.latency for r in asyncio.run(sequential(stack.url, "vip", 8))]
        before = served(stack)
        results = asyncio.run(mixed_load(stack.url, rate=32, seconds=5))  # the pool runs ~16/s
        assert {r.status for r in results} <= {200, 503}, "never a 504, never a lost request"
        assert served(stack) - before == sum(r.status == 200 for r in results)  # each ran once
        stats = by_class(results)
        assert stats["vip"]["shed"] == 0
        assert stats["vip"]["p99"] < max(3 * quantile(unloaded, 0.99), 1.0), stats
        assert stats["standard"]["queue_p50_ms"] > stats["vip"]["queue_p50_ms"], stats
        sheds = [r for r in results if r.status == 503]
        assert len(sheds) > 20, "twice the capacity for 5 s must shed"
        assert sum(r.cls == "standard" for r in sheds) >= 0.9 * len(sheds), stats
        for r in sheds:
            error = r.body["error"]
            assert error["type"] == "overloaded" and isinstance(error["eta_ms"], int) and error["eta_ms"] > 0
            assert int(r.headers["retry-after"]) >= 1
            assert r.latency < 4.5  # at once, or at its 3 s budget: long before Envoy's timeout
        assert all("x-gate-queue-ms" in r.headers for r in results if r.status == 200)


def test_killing_the_scheduler_loses_nothing_and_a_restart_resumes_queueing() -> None:
    port, first_metrics, second_metrics = free_port(), free_port(), free_port()
    with stack_for(free_port(), pools={"primary": {"scheduler": f"127.0.0.1:{port}"}}) as stack:
        config = stack.workdir / "gate.yaml"
        start_scheduler(stack, config, port, first_metrics)
        with httpx.Client(base_url=stack.url, timeout=10) as client:
            body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            r = client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-vip"})
            assert r.status_code == 200 and "x-gate-queue-ms" in r.headers  # queued through the scheduler
        # The slot comes back when the exchange ends (Envoy cancels the finished stream).
        assert settles(lambda: scrape(first_metrics, "gate_queue_in_flight") == 0)
        before = served(stack)

        async def run() -> list[Result]:
            load = asyncio.create_task(mixed_load(stack.url, rate=20, seconds=6))
            await asyncio.sleep(1.5)
            os.killpg(stack.procs["scheduler"].pid, signal.SIGKILL)
            stack.procs.pop("scheduler").wait(5)
            await asyncio.sleep(2.0)
            await asyncio.to_thread(start_scheduler, stack, config, port, second_metrics)
            return await load

        results = asyncio.run(run())
        assert {r.status for r in results} <= {200, 503}
        assert served(stack) - before == sum(r.status == 200 for r in results)  # none lost, none twice
        gate = stack.metrics_ports[0]
        assert scrape(gate, "gate_admission_total", 'outcome="fail_open"') > 0
        assert scrape(second_metrics, "gate_queue_grants_total") > 0  # the restarted one queues again
        assert settles(lambda: scrape(second_metrics, "gate_queue_in_flight") == 0)  # every grant released


def test_vip_preempts_standard_work_on_a_pool_that_schedules_by_priority() -> None:
    """Every slot of a priority-scheduling pool busy with long standard answers: a VIP request
    is let in over the limit with priority 0 and answered while all of them still run; the
    one it displaced is answered too."""
    sim_args = [*SIM_ARGS, "--scheduling-policy", "priority"]
    with stack_for(free_port(), sim_args=sim_args, pool={"preempt_slots": 1}) as stack:

        async def ask(client: httpx.AsyncClient, key: str, tokens: int) -> httpx.Response:
            messages = [{"role": "user", "content": f"{key} {tokens}"}]
            body = {"model": "llama-3-8b", "messages": messages, "max_tokens": tokens, "ignore_eos": True}
            auth = {"authorization": f"Bearer {key}"}
            return await client.post("/v1/chat/completions", json=body, headers=auth)

        async def running(client: httpx.AsyncClient) -> int:
            return int((await client.get(stack.sim_url("primary") + "/admin/state")).json()["running"])

        async def run() -> tuple[httpx.Response, list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
                long = [asyncio.create_task(ask(client, "sk-standard", 150 + i)) for i in range(4)]
                async with asyncio.timeout(10):
                    while await running(client) < 4:  # noqa: ASYNC110 - polling another process
                        await asyncio.sleep(0.02)
                vip = await ask(client, "sk-vip", 5)
                assert not any(t.done() for t in long), "the VIP request waited for a standard one to end"
                return vip, list(await asyncio.gather(*long))

        vip, standard = asyncio.run(run())
        assert vip.status_code == 200
        assert [r.status_code for r in standard] == [200] * 4
        state = httpx.get(stack.sim_url("primary") + "/admin/state").json()
        assert state["preemptions"] >= 1
        assert state["last_request"]["/v1/chat/completions"]["priority"] == 0  # the VIP request, sent last
