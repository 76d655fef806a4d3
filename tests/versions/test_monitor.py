"""Two gate processes' monitors sharing one real Redis: they step together, one of them makes
each change (and sends the rollback's webhook), the other adopts it."""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio as aioredis

from extproc.config import parse_config
from extproc.metrics import Metrics
from extproc.versions import shared
from extproc.versions.monitor import VersionMonitor
from extproc.versions.rollout import RolloutState
from extproc.versions.traffic import Traffic
from load.stack import RedisServer


def routing(prefix: str) -> Any:
    return parse_config(
        f"""
routing:
  pools: {{a: {{cluster: a}}, b: {{cluster: b}}}}
  models: {{}}
  default_pool: null
  version_sync: {{key_prefix: "{prefix}"}}
  versions:
    chat:
      versions: [{{name: v1, pool: a, weight: 100}}, {{name: v2, pool: b, canary: true}}]
      rollout: {{steps: [10, 50, 100], hold_s: 10, min_samples: 5, window_s: 30, slices: 30,
                 max_p95_ratio: 1.5, p95_slack_s: 0.01}}
"""
    ).routing


class Sent:
    """A notifier that keeps what it would have posted."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def notify(self, payload: dict[str, Any]) -> None:
        self.payloads.append(payload)

    async def close(self, wait_s: float = 1.0) -> None:
        return None


def made(metrics: Metrics, phase: str) -> float:
    labels = {"model": "chat", "phase": phase, "origin": "made"}
    return metrics.registry.get_sample_value("gate_rollout_changes_total", labels) or 0.0


async def test_two_processes_step_and_roll_back_together(redis_server: RedisServer) -> None:
    prefix = f"test:{os.getpid()}:versions:"
    now = [10_000.0]
    notes = [Sent(), Sent()]
    metrics = [Metrics(), Metrics()]
    monitors = [
        VersionMonitor(routing(prefix), Traffic(), metrics[i], aioredis.Redis.from_url(redis_server.url),
                       notes[i], clock=lambda: now[0])  # type: ignore[arg-type]
        for i in range(2)
    ]

    async def tick() -> None:
        for m in monitors:
            await m.sync_once()
        for m in monitors:  # the second one's change reaches the first on its next tick
            await m.sync_once()

    def feed(m: VersionMonitor, canary_s: float, n: int = 10) -> None:
        for _ in range(n):
            m.record("chat", "v1", 0.1, False)
            m.record("chat", "v2", canary_s, False)

    try:
        await tick()
        states = [m.traffic.shared["chat"] for m in monitors]
        assert states[0] == states[1] and (states[0].phase, states[0].weight) == ("rolling", 10)

        now[0] += 1
        feed(monitors[0], 0.1)
        feed(monitors[1], 0.1)
        now[0] += 10
        await tick()
        states = [m.traffic.shared["chat"] for m in monitors]
        assert states[0] == states[1] and states[0].weight == 50
        assert made(metrics[0], "rolling") + made(metrics[1], "rolling") == 2  # the start and one step

        now[0] += 1
        feed(monitors[0], 0.1, n=3)
        feed(monitors[1], 0.5, n=3)  # the canary slows down, seen by the second process only
        await tick()
        states = [m.traffic.shared["chat"] for m in monitors]
        assert states[0] == states[1] and (states[0].phase, states[0].weight) == ("rolled_back", 0)
        assert "P95" in states[0].reason
        assert made(metrics[0], "rolled_back") + made(metrics[1], "rolled_back") == 1
        posted = notes[0].payloads + notes[1].payloads
        assert len(posted) == 1 and posted[0]["kind"] == "rollout" and posted[0]["weight"] == 0
        assert posted[0]["old_weight"] == 50 and posted[0]["canary_stats"]["samples"] >= 5

        now[0] += 100  # rolled back stays rolled back
        await tick()
        assert all(m.traffic.shared["chat"].phase == "rolled_back" for m in monitors)
        stored = await shared.read_state(monitors[0].redis, prefix, "chat")  # type: ignore[arg-type]
        assert stored == monitors[0].traffic.shared["chat"]
    finally:
        for m in monitors:
            await m.close()


async def test_alone_without_redis_a_process_decides_on_its_own_samples() -> None:
    now = [500.0]
    m = VersionMonitor(routing("x:"), Traffic(), Metrics(), None, clock=lambda: now[0])
    await m.sync_once()
    assert m.traffic.shared["chat"].weight == 10
    for weight in (50, 100):
        now[0] += 1
        for _ in range(6):
            m.record("chat", "v1", 0.1, False)
            m.record("chat", "v2", 0.1, False)
        now[0] += 10
        await m.sync_once()
        assert m.traffic.shared["chat"].weight == weight
    assert m.traffic.shared["chat"].phase == "done"
    await m.close()



async def test_a_flushed_redis_gets_the_known_state_back_not_a_new_rollout(redis_server: RedisServer) -> None:
    prefix = f"flush:{os.getpid()}:versions:"
    client = aioredis.Redis.from_url(redis_server.url)
    now = [20_000.0]
    m = VersionMonitor(routing(prefix), Traffic(), Metrics(), client, clock=lambda: now[0])
    try:
        await m.sync_once()
        start = m.traffic.shared["chat"]
        rolled = RolloutState("v2", "rolled_back", 0.0, 1, now[0], start.version + 1, "by hand")
        assert await shared.write_state(client, prefix, "chat", start.version, rolled)
        await m.sync_once()
        assert m.traffic.shared["chat"] == rolled
        await client.delete(shared.state_key(prefix, "chat"))  # Redis lost its data
        await m.sync_once()
        assert await shared.read_state(client, prefix, "chat") == rolled  # republished, still at 0
        assert not await shared.write_state(client, prefix, "chat", -1, start)  # a late starter loses
    finally:
        await m.close()


async def test_two_processes_starting_at_once_make_one_start(redis_server: RedisServer) -> None:
    import asyncio

    prefix = f"start:{os.getpid()}:versions:"
    metrics = [Metrics(), Metrics()]
    monitors = [
        VersionMonitor(routing(prefix), Traffic(), metrics[i], aioredis.Redis.from_url(redis_server.url))
        for i in range(2)
    ]
    try:
        await asyncio.gather(*(m.sync_once() for m in monitors))
        await asyncio.gather(*(m.sync_once() for m in monitors))
        assert made(metrics[0], "rolling") + made(metrics[1], "rolling") == 1
        assert monitors[0].traffic.shared["chat"] == monitors[1].traffic.shared["chat"]
    finally:
        for m in monitors:
            await m.close()
