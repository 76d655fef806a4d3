"""The simulator's family answer model and its required upstream key (load/vllm_sim.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from load.stack import free_port, wait_port
from load.vllm_sim import SimConfig, SimServer, start_sim


def chat(content: str) -> dict[str, Any]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}]}


def answer(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimServer]:
    s = await start_sim(SimConfig(base_ttft_ms=1.0, itl_ms=0.0, per_prompt_token_ms=0.0))
    yield s
    await s.close()


@pytest.mark.asyncio
async def test_paraphrases_of_one_family_get_one_answer(sim: SimServer) -> None:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        post = c.post
        a1 = answer(await post("/v1/chat/completions", json=chat("How do I reset my password?"),
                               headers={"x-sim-family": "en-17"}))
        a2 = answer(await post("/v1/chat/completions", json=chat("Password reset: how?"),
                               headers={"x-sim-family": "en-17"}))
        other = answer(await post("/v1/chat/completions", json=chat("How do I reset my password?"),
                                  headers={"x-sim-family": "en-18"}))
        plain1 = answer(await post("/v1/chat/completions", json=chat("How do I reset my password?")))
        plain2 = answer(await post("/v1/chat/completions", json=chat("Password reset: how?")))
        state = (await c.get("/admin/state")).json()
    assert a1 == a2 and "en-17" in a1
    assert other != a1
    # Without a family the answer still follows the prompt, as before.
    assert plain1 != plain2 and "Answer to: How do I reset" in plain1
    assert state["served_by_family"] == {"en-17": 2, "en-18": 1}


@pytest.mark.asyncio
async def test_required_key_refuses_others_and_records_what_arrived() -> None:
    s = await start_sim(SimConfig(base_ttft_ms=1.0, itl_ms=0.0, api_key="sk-upstream"))
    try:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            none = await c.post("/v1/chat/completions", json=chat("hi"))
            wrong = await c.post("/v1/chat/completions", json=chat("hi"),
                                 headers={"authorization": "Bearer sk-client", "x-api-key": "k2"})
            models = await c.get("/v1/models")
            ok = await c.post("/v1/chat/completions", json=chat("hi"),
                              headers={"authorization": "Bearer sk-upstream"})
            state = (await c.get("/admin/state")).json()
    finally:
        await s.close()
    for r in (none, wrong, models):
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "AuthenticationError"
    answer(ok)
    assert state["unauthorized"] == 3 and state["served"] == 1
    assert state["credentials"] == ["Bearer sk-client", "Bearer sk-upstream", "k2"]
    assert state["header_names"]["authorization"] == 2 and state["header_names"]["x-api-key"] == 1
    assert state["config"]["api_key"] == "set"  # the key itself is not shown


def test_key_from_environment_on_the_command_line() -> None:
    port = free_port()
    env = {**os.environ, "VLLM_SIM_API_KEY": "sk-env"}
    proc = subprocess.Popen([sys.executable, "-m", "load.vllm_sim", "--port", str(port)], env=env)
    try:
        wait_port(port, 20, proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            refused = c.post("/v1/chat/completions", json=chat("hi"))
            ok = c.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": "Bearer sk-env"})
    finally:
        proc.terminate()
        proc.wait(10)
    assert refused.status_code == 401
    answer(ok)


@pytest.mark.asyncio
async def test_service_time_by_load_id_and_name_on_json_answers() -> None:
    s = await start_sim(SimConfig(base_ttft_ms=30.0, itl_ms=0.0, name="primary"))
    try:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            r = await c.post("/v1/chat/completions", json=chat("hi"), headers={"x-load-id": "run-1"})
            served = (await c.get("/admin/served")).json()
    finally:
        await s.close()
    answer(r)
    assert r.headers["x-sim-name"] == "primary"  # JSON answers name their pool too, as streams do
    assert 30 <= served["by_id"]["run-1"] <= served["max_ms"]


@pytest.mark.asyncio
async def test_errors_name_their_pool_too() -> None:
    s = await start_sim(SimConfig(base_ttft_ms=1.0, name="fallback"))
    try:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            r = await c.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    finally:
        await s.close()
    assert r.status_code == 404 and r.headers["x-sim-name"] == "fallback"
