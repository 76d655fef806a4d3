"""Progressive delivery through real Envoy: two gate workers sharing Redis, a simulator per
version. A healthy canary reaches 100% on schedule; one made 3x slower is rolled back."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis

from extproc.versions import shared
from extproc.versions.rollout import RolloutState
from load.canary import versions_config, versions_stack
from load.stack import LOOPBACK, Stack, free_port
from tests.e2e.test_versions_sources import Load, metric

PREFIX = "gate:versions:"


def rollout(hold_s: float) -> dict[str, Any]:
    return {"steps": [20, 50, 100], "hold_s": hold_s, "min_samples": 12, "window_s": 10, "slices": 20,
            "max_p95_ratio": 1.5, "p95_slack_s": 0.03}


@contextmanager
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer((LOOPBACK, free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}/hook", got
    finally:
        server.shutdown()


def states(stack: Stack, until: Any, timeout: float) -> list[tuple[float, RolloutState]]:
    """The shared state's changes (when first seen), polled until `until(state)` or the time-out."""
    client = redis.Redis(port=stack.redis_port)
    seen: list[tuple[float, RolloutState]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = shared.decode(client.get(shared.state_key(PREFIX, "chat")))
        if state is not None and (not seen or seen[-1][1] != state):
            seen.append((time.monotonic(), state))
            if until(state):
                return seen
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout}s: {[s for _, s in seen]}")


def stack_for(hold_s: float, hook: str) -> Stack:
    config = versions_config(weight=0, rollout=rollout(hold_s))
    config["breaker"]["webhook"] = {"url": hook, "retries": 1}
    return versions_stack(config, with_redis=True, sim_args=["--itl-ms", "20"])


def test_a_healthy_canary_reaches_100_percent_on_schedule() -> None:
    hold = 2.0
    with webhook() as (hook, posted), stack_for(hold, hook) as stack:
        with Load(stack.url, rate=50) as load:
            seen = states(stack, lambda s: s.phase == "done", 30)
            done_at = seen[-1][0]
            time.sleep(1.5)
        weights = [s.weight for _, s in seen]
        assert weights[-3:] == [20, 50, 100] and seen[-1][1].phase == "done"
        held = [b.since - a.since for (_, a), (_, b) in zip(seen[-3:], seen[-2:], strict=False)]
        print(f"healthy: {weights[-3:]}, steps held {', '.join(f'{h:.2f}s' for h in held)}")
        assert all(hold - 0.2 <= h <= hold + 2.0 for h in held), held  # each step held its time
        assert all(a.status == 200 for a in load.answers)
        late = [a for a in load.answers if a.at > done_at + 0.5]
        assert late and all(a.version == "v2" for a in late)
        assert posted == []  # nothing rolled back


FAULTS = {
    "3x slower": ("/admin/config", {"base_ttft_ms": 60, "itl_ms": 60}, "P95"),
    "20% 5xx": ("/admin/faults", {"error_rate": 0.2, "error_status": 500}, "error rate"),
}


@pytest.mark.parametrize("fault_name", list(FAULTS))
def test_a_worse_canary_is_rolled_back_within_10s_and_stable_is_unaffected(fault_name: str) -> None:
    path, knobs, why = FAULTS[fault_name]
    # Steps long enough that the fault's evidence, not the schedule, decides the 50% step: the
    # simulator's seeded draws fail only 6 of the first 75 calls after a 20% fault starts.
    with webhook() as (hook, posted), stack_for(6.0, hook) as stack:
        with Load(stack.url, rate=50) as load:
            states(stack, lambda s: s.weight == 50, 40)
            time.sleep(0.5)
            fault = time.monotonic()
            assert httpx.post(stack.sim_url("canary") + path, json=knobs).status_code == 200
            seen = states(stack, lambda s: s.phase == "rolled_back", 15)
            rolled_back = seen[-1][0]
            time.sleep(2.0)
        took = rolled_back - fault
        print(f"{fault_name}: rolled back {took:.1f}s after the fault began: {seen[-1][1].reason}")
        assert took < 10.0
        assert seen[-1][1].weight == 0 and why in seen[-1][1].reason
        stable = [a for a in load.answers if a.version == "v1"]
        assert stable and all(a.status == 200 for a in stable)  # stable unaffected
        assert all(a.status == 200 for a in load.answers if a.at < fault)
        after = [a for a in load.answers if a.at > rolled_back + 1.0]
        assert after and all(a.version == "v1" for a in after)
        deadline = time.monotonic() + 5
        while not posted and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(posted) == 1 and posted[0]["kind"] == "rollout" and posted[0]["model"] == "chat"
        made = sum(
            metric(p, "gate_rollout_changes_total", 'model="chat",origin="made",phase="rolled_back"')
            for p in stack.metrics_ports
        )
        assert made == 1  # one worker made the rollback, the other adopted it
        assert "rolled back at 50%" in stack.log("gate")
