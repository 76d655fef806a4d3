"""The shipped Envoy bootstrap under traffic: what a client can and cannot make Envoy do,
what a processor may change, and what clients see when the gate is full or a worker dies."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from extproc import envoy_config
from load.stack import Stack, free_port

from .helpers import LOOPBACK, envoy, rogue_extproc, stat

CHAT = "/v1/chat/completions"


def chat(text: str, model: str = "llama-3-8b") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}


def answer(r: httpx.Response) -> str:
    return str(r.json()["choices"][0]["message"]["content"])


def assert_openai_error(r: httpx.Response) -> dict[str, Any]:
    """A JSON error in OpenAI's shape that names the request, never an empty body."""
    assert r.headers["content-type"].startswith("application/json"), (r.status_code, r.text)
    error = r.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error) and error["message"], error
    assert r.headers.get("x-request-id") or r.headers.get("x-gate-request-id"), r.headers
    return dict(error)


def bootstrap_for(stack: Stack, gate: list[int], **options: Any) -> tuple[dict[str, Any], int, int]:
    listen, admin = free_port(), free_port()
    doc = envoy_config.bootstrap(
        listen=(LOOPBACK, listen),
        admin=(LOOPBACK, admin),
        gate=[(LOOPBACK, p) for p in gate],
        pools={pool: [(LOOPBACK, port)] for pool, port in stack.pool_ports.items()},
        **options,
    )
    return doc, listen, admin


def hang(stack: Stack, pool: str, on: bool) -> None:
    httpx.post(stack.sim_url(pool) + "/admin/faults", json={"hang": on}, timeout=5).raise_for_status()


def served(stack: Stack, pool: str) -> int:
    return int(httpx.get(stack.sim_url(pool) + "/admin/state", timeout=5).json()["served"])


def test_envoy_itself_drops_client_gate_headers_before_routing() -> None:
    """Fail-open with the gate down: nothing but Envoy stands between the client and the routes."""
    spoof = {"x-gate-cluster": "fallback", "x_gate_cluster": "fallback", "x-gate-cache": "hit"}
    with Stack(failure_mode_allow=True) as stack, httpx.Client(base_url=stack.url, timeout=10) as client:
        stack.stop_gate()
        r = client.post(CHAT, json=chat("who answers?"), headers=spoof)
        assert r.status_code == 200 and answer(r).startswith("[llama-3-8b]")  # primary, not fallback
        models = client.get("/v1/models", headers=spoof).json()
        assert [m["id"] for m in models["data"]] == ["llama-3-8b"]
        assert served(stack, "fallback") == 0


def test_a_processor_routes_only_by_its_own_header_and_cannot_touch_others() -> None:
    with Stack(external_gate=True) as stack, rogue_extproc() as port:
        doc, listen, admin = bootstrap_for(stack, [port])
        with (
            envoy(doc, listen, admin) as admin_url,
            httpx.Client(base_url=f"http://{LOOPBACK}:{listen}", timeout=10) as client,
        ):
            # A chat request the processor did not route never reaches a pool.
            before = served(stack, "primary") + served(stack, "fallback")
            r = client.post(CHAT, json=chat("not routed"), headers={"x-request-id": "client-id-1"})
            assert r.status_code == 503
            assert assert_openai_error(r)["code"] == "not_routed"
            assert r.headers["x-request-id"] == "client-id-1"  # the client's id is kept
            assert served(stack, "primary") + served(stack, "fallback") == before
            # Its routing header works; the headers outside the gate's own set are dropped.
            r = client.post(CHAT, json=chat("route-me please", model="phi-3-mini"))
            assert r.status_code == 200 and answer(r).startswith("[phi-3-mini]")
            assert r.headers["x-gate-probe"] == "1" and "x-evil" not in r.headers
            assert stat(admin_url, "rejected_header_mutations") >= 4
            # Paths the gate passes through still reach the default pool.
            assert client.get("/v1/models").json()["data"][0]["id"] == "llama-3-8b"


def test_a_full_gate_cluster_answers_a_json_503_with_a_request_id() -> None:
    with Stack() as stack:
        doc, listen, admin = bootstrap_for(stack, stack.gate_ports, gate_streams=8)
        hang(stack, "primary", True)
        hang(stack, "fallback", True)

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=f"http://{LOOPBACK}:{listen}", timeout=60) as c:
                calls = [asyncio.create_task(c.post(CHAT, json=chat(f"q{i}"))) for i in range(40)]
                await asyncio.sleep(3)
                await asyncio.to_thread(hang, stack, "primary", False)
                await asyncio.to_thread(hang, stack, "fallback", False)
                return await asyncio.gather(*calls)

        with envoy(doc, listen, admin):
            results = asyncio.run(burst())
        overflow = [
            r for r in results if r.status_code == 503 and r.json()["error"]["code"] == "gate_overloaded"
        ]
        assert len(overflow) >= 20, [r.status_code for r in results]
        for r in overflow:
            assert_openai_error(r)
            assert r.headers["retry-after"] == "1" and r.headers["x-should-retry"] == "true"
        for r in results:
            if r.status_code != 200:
                assert_openai_error(r)


@pytest.mark.parametrize("concurrency", [1150])
def test_requests_beyond_envoys_old_limits_against_hung_pools_never_get_an_empty_500(
    concurrency: int,
) -> None:
    """Over Envoy's default 1,024 on the gate cluster: each client gets an answer or a JSON error."""
    with Stack(gate_workers=2) as stack:
        hang(stack, "primary", True)
        hang(stack, "fallback", True)

        async def burst() -> list[httpx.Response | Exception]:
            limits = httpx.Limits(max_connections=concurrency + 50, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=stack.url, timeout=120, limits=limits) as c:
                calls = [
                    asyncio.create_task(c.post(CHAT, json=chat(f"hung {i}"))) for i in range(concurrency)
                ]
                await asyncio.sleep(10)
                await asyncio.to_thread(hang, stack, "primary", False)
                await asyncio.to_thread(hang, stack, "fallback", False)
                return await asyncio.gather(*calls, return_exceptions=True)

        results = asyncio.run(burst())
        failed = [r for r in results if isinstance(r, Exception)]
        assert not failed, failed[:3]
        statuses: dict[int, int] = {}
        for r in results:
            assert isinstance(r, httpx.Response)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code != 200:
                assert_openai_error(r)
        assert statuses.get(200, 0) > 0, statuses
        print(f"{concurrency} concurrent against hung pools: {sorted(statuses.items())}")


def listener_pid(port: int) -> int:
    """The process that holds the listening socket on `port` (Linux /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                return int(entry)
        except OSError:
            continue
    raise LookupError(f"no process listens on {port}")


def test_a_killed_gate_worker_costs_a_few_json_errors_at_most() -> None:
    with Stack(gate_workers=2) as stack, httpx.Client(base_url=stack.url, timeout=10) as client:
        for i in range(10):
            assert client.post(CHAT, json=chat(f"warm {i}")).status_code == 200
        os.kill(listener_pid(stack.gate_ports[0]), signal.SIGKILL)
        results = []
        started = time.monotonic()
        while time.monotonic() - started < 3:
            results.append(client.post(CHAT, json=chat(f"after {len(results)}")))
        failed = [r for r in results if r.status_code != 200]
        for r in failed:
            assert_openai_error(r)
        assert len(failed) <= 3, (len(failed), len(results))
        print(f"gate worker killed: {len(failed)} of {len(results)} requests failed in the next 3 s")
        assert len(results) >= 20


def test_a_5xx_a_model_produced_is_answered_once_and_a_refused_connection_is_retried() -> None:
    with Stack(external_gate=True) as stack, rogue_extproc() as port:
        dead = free_port()
        listen, admin = free_port(), free_port()
        doc = envoy_config.bootstrap(
            listen=(LOOPBACK, listen),
            admin=(LOOPBACK, admin),
            gate=[(LOOPBACK, port)],
            pools={
                "primary": [(LOOPBACK, stack.pool_ports["primary"])],
                "fallback": [(LOOPBACK, dead), (LOOPBACK, stack.pool_ports["fallback"])],
            },
        )
        body = chat("route-me", model="phi-3-mini")
        with (
            envoy(doc, listen, admin) as admin_url,
            httpx.Client(base_url=f"http://{LOOPBACK}:{listen}", timeout=10) as client,
        ):
            # Half the fallback pool refuses connections: each call still gets its answer. The
            # balancer picks between the two at random (ten calls missed the refusing one once
            # in CI), so calls go on until it has been picked.
            for _ in range(60):
                assert client.post(CHAT, json=body).status_code == 200
                if stat(admin_url, "cluster.fallback.upstream_cx_connect_fail") >= 1:
                    break
            assert stat(admin_url, "cluster.fallback.upstream_cx_connect_fail") >= 1
            assert stat(admin_url, "cluster.fallback.upstream_rq_retry") >= 1
            # A model that answers 500: one call, one model request, the 500 passed on.
            faults = {"error_rate": 1.0, "error_status": 500}
            httpx.post(stack.sim_url("fallback") + "/admin/faults", json=faults).raise_for_status()
            before = stat(admin_url, "cluster.fallback.upstream_rq_completed")
            retries = stat(admin_url, "cluster.fallback.upstream_rq_retry")
            refused = stat(admin_url, "cluster.fallback.upstream_cx_connect_fail")
            assert client.post(CHAT, json=body).status_code == 500
            assert stat(admin_url, "cluster.fallback.upstream_rq_completed") == before + 1
            # A retry here is only ever the refused half of the pool (the call may pick it
            # first), never a second try of the model's 500.
            retried = stat(admin_url, "cluster.fallback.upstream_rq_retry") - retries
            assert retried == stat(admin_url, "cluster.fallback.upstream_cx_connect_fail") - refused


def test_a_streamed_answer_may_outlast_the_idle_timeout_while_a_silent_pool_may_not() -> None:
    with Stack() as stack:
        doc, listen, admin = bootstrap_for(stack, stack.gate_ports, idle_timeout_s=1)
        config = {"itl_ms": 250.0}  # 20 tokens: about 5 s in all, far over the 1 s idle timeout
        httpx.post(stack.sim_url("primary") + "/admin/config", json=config).raise_for_status()
        with envoy(doc, listen, admin), httpx.Client(base_url=f"http://{LOOPBACK}:{listen}", timeout=30) as c:
            r = c.post(CHAT, json={**chat("a long story"), "max_tokens": 20, "stream": True})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
            assert r.text.count("data: ") >= 12  # each 250 ms apart: the whole stream outlasts 1 s
            hang(stack, "primary", True)
            r = c.post(CHAT, json=chat("silence"))
            hang(stack, "primary", False)
            assert r.status_code == 504
            assert_openai_error(r)


def test_the_overload_manager_caps_downstream_connections() -> None:
    with Stack() as stack:
        doc, listen, admin = bootstrap_for(stack, stack.gate_ports)
        doc["overload_manager"] = envoy_config.overload_manager(max_connections=4)
        with envoy(doc, listen, admin) as admin_url:
            clients = [httpx.Client(base_url=f"http://{LOOPBACK}:{listen}", timeout=5) for _ in range(8)]
            try:
                outcomes = []
                for client in clients:
                    try:
                        outcomes.append(client.get("/v1/models").status_code)
                    except httpx.TransportError:
                        outcomes.append(0)
            finally:
                for client in clients:
                    client.close()
            assert outcomes.count(200) == 4 and outcomes.count(0) == 4, outcomes
            assert stat(admin_url, "downstream_global_cx_overflow") == 4
