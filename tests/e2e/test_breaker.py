"""The latency breaker through the real Envoy: two gate processes, Redis, two simulated pools.

Steady light load; the primary is slowed past the threshold by its fault endpoint → new
requests go to the fallback (its model in the body, `x-gate-cluster: fallback`) with no
client error, both gate processes switch, a webhook receiver hears of it; the primary is
restored → probes succeed → traffic returns after the (shortened) recovery period.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from load.stack import RedisServer, Stack, free_port

CHAT = "/v1/chat/completions"
WINDOW_S = 4.0


class Hooks:
    """A local webhook receiver."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                hooks.got.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def transitions(self, pool: str = "primary") -> list[tuple[str, str]]:
        return [(h["old_state"], h["new_state"]) for h in self.got if h["pool"] == pool]


@dataclass
class Result:
    at: float
    status: int
    cluster: str | None
    model: str | None
    stream: bool


class Load:
    """A few clients sending small requests back to back (one of them streams)."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url = url
        self.results: list[Result] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def _run(self, index: int) -> None:
        stream = index == 0
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                body = {
                    "model": "llama-3-8b",
                    "max_tokens": 6,
                    "stream": stream,
                    "messages": [{"role": "user", "content": f"client {index} question {n}"}],
                }
                try:
                    self.results.append(self._one(client, body, stream))
                except httpx.HTTPError:
                    self.results.append(Result(time.monotonic(), 0, None, None, stream))

    @staticmethod
    def _one(client: httpx.Client, body: dict[str, Any], stream: bool) -> Result:
        if not stream:
            r = client.post(CHAT, json=body)
            model = r.json().get("model") if r.status_code == 200 else None
            return Result(time.monotonic(), r.status_code, r.headers.get("x-gate-cluster"), model, False)
        with client.stream("POST", CHAT, json=body) as r:
            text = r.read().decode()
        frames = [f[6:] for f in text.split("\n\n") if f.startswith("data: {")]
        model = json.loads(frames[0])["model"] if frames else None
        complete = text.rstrip().endswith("data: [DONE]")
        return Result(
            time.monotonic(), r.status_code if complete else 0, r.headers.get("x-gate-cluster"), model, True
        )

    def since(self, t: float) -> list[Result]:
        return [r for r in list(self.results) if r.at >= t]


def wait_for(what: str, check: Any, timeout: float, every: float = 0.1) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s: {what}")


def breaker_state(metrics_port: int, pool: str = "primary") -> float | None:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
    for line in text.splitlines():
        if line.startswith(f'gate_breaker_state{{pool="{pool}"}}'):
            return float(line.split()[-1])
    return None


def reroutes(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("gate_breaker_reroutes_total{")
    )


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.server.shutdown()


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, hooks: Hooks) -> Iterator[Stack]:
    config = {
        "store": {"redis_url": redis_server.url},
        "breaker": {
            "window_s": WINDOW_S,
            "slices": 20,
            "min_samples": 4,
            "open_p95_s": 0.8,
            "close_p95_s": 0.5,
            "hold_s": 3,
            "recovery_s": 3,
            "probe_share": 0.2,
            "probe_interval_s": 0.5,
            "probe_min_samples": 2,
            "sync_interval_s": 0.25,
            "webhook": {"url": hooks.url, "backoff_s": 0.1, "deadline_s": 5},
        },
    }
    with Stack(gate_workers=2, gate_config=config) as s:
        yield s


def test_slow_primary_fails_over_to_the_fallback_and_comes_back(stack: Stack, hooks: Hooks) -> None:
    faults = stack.sim_url("primary") + "/admin/faults"
    with Load(stack.url) as load:
        wait_for("traffic on the primary", lambda: len(load.since(0)) >= 8, 10)
        assert {r.cluster for r in load.results} == {"primary"}

        slowed = time.monotonic()
        httpx.post(faults, json={"extra_latency_ms": 1500}).raise_for_status()
        opened = wait_for(
            "the webhook: closed → open", lambda: ("closed", "open") in hooks.transitions(), WINDOW_S + 8
        )
        wait_for(
            "both gate processes open", lambda: all(breaker_state(p) == 2 for p in stack.metrics_ports), 1.5
        )
        note = hooks.got[0]
        assert note["p95_s"] > 0.8 and note["samples"] >= 4 and note["window_s"] == WINDOW_S
        # Restore before the hold ends, so the first probes find a healthy primary.
        restored = time.monotonic()
        httpx.post(faults, json={"extra_latency_ms": 0}).raise_for_status()

        wait_for(
            "requests served by the fallback",
            lambda: sum(r.cluster == "fallback" for r in load.since(0)) >= 6,
            5,
        )
        assert all(reroutes(p) > 0 for p in stack.metrics_ports), (
            "each gate process re-routed requests itself"
        )
        fallback = [r for r in load.results if r.cluster == "fallback"]
        assert {r.model for r in fallback} == {"phi-3-mini"}
        assert any(r.stream for r in fallback) and any(not r.stream for r in fallback)
        seen = httpx.get(stack.sim_url("fallback") + "/admin/state").json()["last_request"][CHAT]
        assert seen["model"] == "phi-3-mini"

        back = wait_for(
            "probes, then the primary again", lambda: ("half_open", "closed") in hooks.transitions(), 15
        )
        time.sleep(1.0)
        tail = load.since(back + 0.5)
        assert tail and {r.cluster for r in tail} == {"primary"}
        assert all(breaker_state(p) == 0 for p in stack.metrics_ports)

    assert hooks.transitions() == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")], (
        hooks.got
    )
    errors = [r for r in load.results if r.status != 200]
    assert not errors, f"clients saw errors during the switch: {errors[:5]}"
    half_open = (
        next(h["at"] for h in hooks.got if h["new_state"] == "half_open") - time.time() + time.monotonic()
    )
    probes = [r for r in load.results if half_open < r.at < back and r.cluster == "primary"]
    assert probes, "the primary got probe traffic while half-open"
    print(
        f"\nopen {opened - slowed:.1f}s after the slowdown; back on the primary {back - restored:.1f}s "
        f"after the restore; {len(load.results)} requests, {len(probes)} probes, 0 errors"
    )
