"""Retries that do not multiply, with the official SDK and its default retries (2): a model's
500 costs one model call, and a model slower than the client's timeout costs one, not three."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from load.stack import Stack

KEY = "sk-test"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    config = {
        "identity": {"api_keys": {KEY: {"tenant": "acme", "tier": "vip"}}},
        "cache": {"semantic": {"enabled": False}},
    }
    with Stack(gate_config=config, with_redis=True, sim_args=["--itl-ms", "5"]) as s:
        yield s


def received(stack: Stack) -> int:
    return int(httpx.get(stack.sim_url("primary") + "/admin/state").json()["received"])


def faults(stack: Stack, **values: object) -> None:
    httpx.post(stack.sim_url("primary") + "/admin/faults", json=values).raise_for_status()


def ask(stack: Stack, text: str, timeout: float = 30) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, timeout=timeout)  # max_retries=2
    client.chat.completions.create(model="llama-3-8b", messages=[{"role": "user", "content": text}])


def test_a_models_500_is_one_model_call_per_sdk_call(stack: Stack) -> None:
    before = received(stack)
    faults(stack, error_rate=1.0, error_status=500)
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            ask(stack, "a question the model fails")
    finally:
        faults(stack, error_rate=0.0)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert received(stack) - before == 1


def test_a_model_slower_than_the_clients_timeout_is_not_called_again_by_its_retries(stack: Stack) -> None:
    before = received(stack)
    faults(stack, extra_latency_ms=3000)
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            ask(stack, "a question slower than my timeout", timeout=1.0)
    finally:
        faults(stack, extra_latency_ms=0)
    error = caught.value
    assert error.status_code == 504 and error.code == "client_timeout_too_short"
    assert "timeout (1 s)" in error.message and error.request_id
    assert received(stack) - before == 1  # the first attempt only; its retry was answered at once
