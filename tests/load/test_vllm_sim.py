"""Tests for the vLLM simulator (load/vllm_sim.py), over real sockets with httpx."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from load.vllm_sim import STATE, SimConfig, SimServer, create_app, start_sim

pytestmark = pytest.mark.asyncio



def fast_cfg(**kw: Any) -> SimConfig:
    return SimConfig(base_ttft_ms=1.0, itl_ms=1.0, per_prompt_token_ms=0.0, **kw)


async def wait_for_state(c: httpx.AsyncClient, key: str, value: int) -> dict[str, Any]:
    for _ in range(100):
        st: dict[str, Any] = (await c.get("/admin/state")).json()
        if st[key] == value:
            return st
        await asyncio.sleep(0.01)
    raise AssertionError(f"{key} never reached {value}: {st}")


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimServer]:
    s = await start_sim(fast_cfg(models=["llama-3-8b", "mistral-7b"]))
    yield s
    await s.close()


@pytest_asyncio.fixture
async def client(sim: SimServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        yield c


def chat(content: str, model: str = "llama-3-8b", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **kw}


def metric(text: str, name: str, model: str = "llama-3-8b") -> float:
    prefix = f'{name}{{model_name="{model}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    raise AssertionError(f"{prefix!r} not in metrics")


async def test_chat_json_shape_and_determinism(client: httpx.AsyncClient) -> None:
    body = chat("hello there world", max_tokens=64)
    r1 = await client.post("/v1/chat/completions", json=body)
    r2 = await client.post("/v1/chat/completions", json=body)
    assert r1.status_code == 200
    d1, d2 = r1.json(), r2.json()
    assert d1["id"].startswith("chatcmpl-") and d1["object"] == "chat.completion"
    assert d1["model"] == "llama-3-8b" and isinstance(d1["created"], int)
    msg = d1["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert msg["content"].startswith("[llama-3-8b] Answer to: hello there world")
    assert msg["content"] == d2["choices"][0]["message"]["content"]
    n = len(msg["content"].split())
    assert 8 <= n <= 32 and d1["choices"][0]["finish_reason"] == "stop"
    assert d1["usage"] == {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
    other = (await client.post("/v1/chat/completions", json=chat("hello", "mistral-7b"))).json()
    assert other["choices"][0]["message"]["content"].startswith("[mistral-7b] ")
    short = (await client.post("/v1/chat/completions", json=chat("hi", max_tokens=2))).json()
    assert short["choices"][0]["message"]["content"] == "[llama-3-8b] Answer"
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 2


async def test_completions_endpoint(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions",
                          json={"model": "mistral-7b", "prompt": "one two", "max_tokens": 50})
    d = r.json()
    assert r.status_code == 200 and d["id"].startswith("cmpl-")
    assert d["object"] == "text_completion"
    assert d["choices"][0]["text"].startswith("[mistral-7b] Answer to: one two")
    assert d["usage"]["prompt_tokens"] == 2


async def test_errors_models_and_health(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat("x", model="gpt-9"))
    assert r.status_code == 404
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "gpt-9" in err["message"]
    r = await client.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "message" in r.json()["error"]
    r = await client.post("/v1/chat/completions", json=chat("x", max_tokens=0))
    assert r.status_code == 400
    ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert ids == ["llama-3-8b", "mistral-7b"]
    assert (await client.get("/health")).status_code == 200


async def test_streaming_chunks_arrive_over_time(client: httpx.AsyncClient) -> None:
    await client.post("/admin/faults", json={"itl_ms": 40})
    body = chat("stream me", max_tokens=8, ignore_eos=True, stream=True,
                stream_options={"include_usage": True})
    frames: list[tuple[float, str]] = []
    t0 = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line:
                frames.append((time.monotonic() - t0, line))
    assert all(f.startswith("data: ") for _, f in frames)
    assert frames[-1][1] == "data: [DONE]"
    chunks = [orjson.loads(f[6:]) for _, f in frames[:-1]]
    assert len(chunks) == 8 + 2  # one per token, finish chunk, usage chunk
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text.startswith("[llama-3-8b] Answer to: stream me") and len(text.split()) == 8
    # 7 gaps of >= 40 ms between the first and last token frames
    assert frames[7][0] - frames[0][0] >= 0.25


async def test_stream_disconnect_releases_slot(sim: SimServer,
                                               client: httpx.AsyncClient) -> None:
    await client.post("/admin/faults", json={"itl_ms": 50})
    body = chat("bye", max_tokens=30, ignore_eos=True, stream=True)
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        async for _ in r.aiter_lines():
            break
        assert sim.state.sched.running == 1
    for _ in range(50):
        if sim.state.sched.running == 0:
            break
        await asyncio.sleep(0.02)
    assert sim.state.sched.running == 0 and sim.state.sched.kv_used == 0
    assert (await client.get("/admin/state")).json()["cancelled"] == 1


async def test_max_num_seqs_queueing_in_metrics(client: httpx.AsyncClient) -> None:
    r = await client.post("/admin/config", json={"max_num_seqs": 2, "itl_ms": 30})
    assert r.json()["max_num_seqs"] == 2
    body = chat("queue", max_tokens=6, ignore_eos=True)
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=body))
             for _ in range(5)]
    await wait_for_state(client, "waiting", 3)
    text = (await client.get("/metrics")).text
    assert metric(text, "vllm:num_requests_running") == 2
    assert metric(text, "vllm:num_requests_waiting") == 3
    assert 0 < metric(text, "vllm:kv_cache_usage_perc") < 1
    assert all(r.status_code == 200 for r in await asyncio.gather(*tasks))
    text = (await client.get("/metrics")).text
    assert metric(text, "vllm:num_requests_waiting") == 0
    assert metric(text, "vllm:generation_tokens_total") == 30
    assert metric(text, "vllm:prompt_tokens_total") == 5
    assert 'vllm:time_to_first_token_seconds_count{model_name="llama-3-8b"} 5.0' in text
    assert 'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="llama-3-8b"}' in text


async def test_kv_cache_limits_admission(client: httpx.AsyncClient) -> None:
    await client.post("/admin/config", json={"kv_cache_tokens": 50, "itl_ms": 15})
    body = chat("kv", max_tokens=20, ignore_eos=True)  # needs 21 tokens of KV
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=body))
             for _ in range(3)]
    st = await wait_for_state(client, "waiting", 1)
    assert (st["running"], st["waiting"], st["kv_cache_used_tokens"]) == (2, 1, 42)
    assert all(r.status_code == 200 for r in await asyncio.gather(*tasks))
    r = await client.post("/v1/chat/completions", json=chat("kv", max_tokens=60))
    assert r.status_code == 400  # can never fit


async def test_error_rate_and_extra_latency(client: httpx.AsyncClient) -> None:
    await client.post("/admin/faults", json={"error_rate": 1.0, "error_status": 503})
    r = await client.post("/v1/chat/completions", json=chat("x"))
    assert r.status_code == 503
    assert r.json()["error"]["code"] == 503 and r.json()["error"]["message"]
    await client.post("/admin/faults", json={"error_rate": 0.5})
    codes = [(await client.post("/v1/chat/completions", json=chat("x"))).status_code
             for _ in range(20)]
    assert 0 < codes.count(503) < 20
    await client.post("/admin/reset")
    await client.post("/admin/faults", json={"extra_latency_ms": 300})
    t0 = time.monotonic()
    r = await client.post("/v1/chat/completions", json=chat("slow"))
    assert r.status_code == 200 and time.monotonic() - t0 >= 0.3
    r = await client.post("/admin/faults", json={"bogus": 1})
    assert r.status_code == 400


async def test_error_rate_is_reproducible() -> None:
    async def run() -> list[int]:
        s = await start_sim(fast_cfg(seed=7))
        async with httpx.AsyncClient(base_url=s.url) as c:
            await c.post("/admin/faults", json={"error_rate": 0.5})
            out = [(await c.post("/v1/completions", json={"prompt": "p"})).status_code
                   for _ in range(12)]
        await s.close()
        return out
    assert await run() == await run()


async def test_hang_then_reset_releases(sim: SimServer, client: httpx.AsyncClient) -> None:
    await client.post("/admin/faults", json={"hang": True})
    task = asyncio.create_task(client.post("/v1/chat/completions", json=chat("stuck")))
    await asyncio.sleep(0.3)
    assert not task.done()
    await wait_for_state(client, "hung", 1)
    await client.post("/admin/reset")
    r = await asyncio.wait_for(task, 2)
    assert r.status_code == 200
    assert sim.state.hung == 0 and sim.state.served == 1


async def test_hung_request_does_not_leak_on_disconnect(client: httpx.AsyncClient) -> None:
    await client.post("/admin/faults", json={"hang": True})
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/chat/completions", json=chat("gone"), timeout=0.2)
    await wait_for_state(client, "hung", 0)


async def test_hung_request_leak_without_handler_cancellation() -> None:
    app = create_app(fast_cfg())
    runner = web.AppRunner(app)  # aiohttp default: handlers not cancelled on disconnect
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            await c.post("/admin/faults", json={"hang": True})
            with pytest.raises(httpx.ReadTimeout):
                await c.post("/v1/chat/completions", json=chat("gone"), timeout=0.2)
            await asyncio.sleep(0.5)  # the hang loop polls the socket every 0.2 s
            st = (await c.get("/admin/state")).json()
            assert st["hung"] == 0 and st["cancelled"] == 1 and st["served"] == 0
    finally:
        await runner.cleanup()
    assert app[STATE].sched.running == 0


async def test_admin_state_counters_and_last_request(client: httpx.AsyncClient) -> None:
    for m in ("llama-3-8b", "llama-3-8b", "mistral-7b"):
        await client.post("/v1/chat/completions", json=chat("count", m),
                          headers={"x-test-id": "abc"})
    st = (await client.get("/admin/state")).json()
    assert st["served"] == 3
    assert st["served_by_model"] == {"llama-3-8b": 2, "mistral-7b": 1}
    assert st["last_request"]["/v1/chat/completions"]["model"] == "mistral-7b"
    assert st["last_headers"]["/v1/chat/completions"]["x-test-id"] == "abc"
    assert st["running"] == 0 and st["waiting"] == 0 and st["faults"]["error_rate"] == 0
    st = (await client.post("/admin/reset")).json()
    assert st["served"] == 0 and st["last_request"] == {}


ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_cli_runs() -> None:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "load.vllm_sim", "--port", str(port), "--model", "a",
        "--model", "b", "--itl-ms", "1", "--max-num-seqs", "3", cwd=ROOT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            for _ in range(100):
                try:
                    if (await c.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["a", "b"]
            cfg = (await c.get("/admin/state")).json()["config"]
            assert cfg["itl_ms"] == 1.0 and cfg["max_num_seqs"] == 3
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 5)


async def test_priority_policy_preempts_lower_priority_work_and_fcfs_refuses_priorities() -> None:
    """Two slots busy with priority-2 requests: a priority-0 request starts at once (one of
    them is preempted, waits, recomputes, and still finishes); under fcfs a priority is a 400."""
    cfg = SimConfig(base_ttft_ms=1.0, itl_ms=20.0, max_num_seqs=2, scheduling_policy="priority")
    s = await start_sim(cfg)
    try:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            low = [chat(f"low {i}", max_tokens=20, ignore_eos=True, priority=2) for i in range(2)]
            slow = [asyncio.create_task(c.post("/v1/chat/completions", json=b)) for b in low]
            await wait_for_state(c, "running", 2)
            high = chat("high", max_tokens=5, ignore_eos=True, priority=0)
            vip = await c.post("/v1/chat/completions", json=high)
            assert vip.status_code == 200
            assert not any(t.done() for t in slow)  # it did not wait for a low one to end
            assert [r.status_code for r in await asyncio.gather(*slow)] == [200, 200]
            assert s.state.sched.preemptions == 1
            assert s.state.sched.running == 0 and s.state.sched.kv_used == 0
    finally:
        await s.close()
    fcfs = await start_sim(fast_cfg())
    try:
        async with httpx.AsyncClient(base_url=fcfs.url, timeout=10) as c:
            r = await c.post("/v1/chat/completions", json=chat("hi", priority=1))
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
    finally:
        await fcfs.close()
