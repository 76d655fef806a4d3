"""What Envoy does when the gate is down, and how gate workers share the load."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import httpx
import pytest

from load.stack import Stack

CHAT = "/v1/chat/completions"
BODY = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "are you there?"}]}


@pytest.mark.parametrize(("allow", "expected"), [(False, 500), (True, 200)])
def test_gate_down_fails_fast_or_opens_as_configured(allow: bool, expected: int) -> None:
    with Stack(failure_mode_allow=allow) as stack, httpx.Client(base_url=stack.url, timeout=10) as client:
        assert client.post(CHAT, json=BODY).headers["x-gate-cluster"] == "primary"
        stack.stop_gate()
        started = time.perf_counter()
        r = client.post(CHAT, json=BODY)
        elapsed = time.perf_counter() - started
        assert r.status_code == expected
        assert "x-gate-request-id" not in r.headers
        if allow:
            assert r.json()["choices"][0]["message"]["content"].startswith("[llama-3-8b]")
        else:
            assert elapsed < 2.0  # fails fast instead of waiting for message_timeout (35 s)


def gate_requests(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("gate_requests_total{")
    )


def test_two_workers_both_take_streams() -> None:
    with Stack(gate_workers=2) as stack, httpx.Client(base_url=stack.url, timeout=10) as client:
        for i in range(40):
            body = {**BODY, "messages": [{"role": "user", "content": f"question {i}"}]}
            assert client.post(CHAT, json=body).status_code == 200
        # A request is counted when its ext_proc stream closes, just after the client's answer.
        deadline = time.monotonic() + 5
        counts = [gate_requests(p) for p in stack.metrics_ports]
        while sum(counts) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
            counts = [gate_requests(p) for p in stack.metrics_ports]
        assert sum(counts) == 40
        assert min(counts) >= 10, counts


def test_envoys_own_errors_are_openai_json_too() -> None:
    with Stack() as stack, httpx.Client(base_url=stack.url, timeout=10) as client:

        def chunks() -> Iterator[bytes]:  # no content-length: Envoy's buffer limit answers
            for _ in range(12):
                yield b"x" * 100_000

        r = client.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        error = r.json()["error"]
        assert error["code"] == "request_too_large" and "1048576 bytes" in error["message"]
        assert (
            client.post(CHAT, content=b"{", headers={"content-type": "application/json"}).json()["error"][
                "type"
            ]
            == "invalid_request_error"
        )  # the gate's own replies are left as they are

        stack._stop("sim-primary")
        r = client.post(CHAT, json=BODY)
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["type"] == "upstream_error" and error["message"] and error["code"]
        assert set(error) == {"message", "type", "param", "code"}
