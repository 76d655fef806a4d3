"""Through a real Envoy, with the gate and two simulated pools on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from load.stack import Stack

CHAT = "/v1/chat/completions"


def chat(content: str = "What is the capital of France?", **extra: object) -> dict[str, object]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    config = {
        "validation": {
            "required_headers": [{"header": "x-business-scene", "path_prefix": "/v1/completions"}]
        },
        "identity": {"api_keys": {"sk-vip": {"tenant": "acme", "tier": "vip"}}},
    }
    with Stack(gate_config=config, sim_args=["--itl-ms", "20"]) as s:
        yield s


@pytest.fixture
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=20) as c:
        yield c


def sim_state(stack: Stack, pool: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(stack.sim_url(pool) + "/admin/state").json()  # type: ignore[no-any-return]


def test_valid_chat_gets_the_primary_answer_with_gate_headers(client: httpx.Client) -> None:
    r = client.post(CHAT, json=chat("hello gate"))
    assert r.status_code == 200
    assert r.headers["x-gate-cluster"] == "primary"
    assert r.headers["x-gate-request-id"] == r.headers["x-request-id"] != ""
    body = r.json()
    assert body["choices"][0]["message"]["content"].startswith("[llama-3-8b] Answer to: hello gate")


def test_the_clients_request_id_names_the_request_and_its_key_stays_here(
    client: httpx.Client, stack: Stack
) -> None:
    r = client.post(
        CHAT, json=chat("whose id?"),
        headers={"x-request-id": "client-id-123", "authorization": "Bearer sk-client-secret"},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == r.headers["x-gate-request-id"] == "client-id-123"
    bad = client.post(CHAT, json={"model": 3}, headers={"x-request-id": "client-id-456"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "client-id-456"
    seen = sim_state(stack, "primary")["last_headers"][CHAT]
    assert "authorization" not in seen and "x-api-key" not in seen
    # Envoy's access log names the request by the same id, in JSON, and never holds the key.
    deadline = time.monotonic() + 5
    while '"client-id-123"' not in stack.log("envoy") and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [json.loads(x) for x in stack.log("envoy").splitlines() if x.startswith("{")]
    mine = [x for x in lines if x["request_id"] == "client-id-123"]
    assert mine and mine[0]["status"] == 200 and mine[0]["path"] == CHAT
    assert "sk-client-secret" not in stack.log("envoy")


def test_fallback_model_alias_is_served_by_fallback_with_rewritten_model(
    client: httpx.Client, stack: Stack
) -> None:
    r = client.post(CHAT, json={**chat("small model please"), "model": "phi-3"})
    assert r.status_code == 200, r.text
    assert r.headers["x-gate-cluster"] == "fallback"
    assert r.json()["model"] == "phi-3-mini"
    seen = sim_state(stack, "fallback")["last_request"][CHAT]
    assert seen["model"] == "phi-3-mini"


def test_client_sent_gate_headers_have_no_effect(client: httpx.Client, stack: Stack) -> None:
    r = client.post(
        CHAT, json=chat("route me"), headers={"x-gate-cluster": "fallback", "x-gate-cache": "hit"}
    )
    assert r.status_code == 200
    assert r.headers["x-gate-cluster"] == "primary"
    assert "[llama-3-8b]" in r.json()["choices"][0]["message"]["content"]
    seen = sim_state(stack, "primary")["last_headers"][CHAT]
    assert seen.get("x-gate-cache") is None
    assert seen.get("x-gate-cluster") == "primary"


def test_passthrough_path_is_untouched_and_strips_gate_headers(client: httpx.Client) -> None:
    r = client.get("/v1/models", headers={"x-gate-cluster": "fallback"})
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["llama-3-8b"]
    assert "x-gate-request-id" not in r.headers


def test_stream_arrives_chunk_by_chunk(client: httpx.Client) -> None:
    arrivals: list[float] = []
    text = ""
    payload = chat("stream this", stream=True, max_tokens=12, stream_options={"include_usage": True})
    with client.stream("POST", CHAT, json=payload) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-gate-cluster"] == "primary"
        for chunk in r.iter_text():
            arrivals.append(time.perf_counter())
            text += chunk
    frames = [f for f in text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert '"usage"' in frames[-2]
    # 12 tokens at 20 ms each: a buffered reply would arrive in one piece.
    assert len(arrivals) >= 6
    assert arrivals[-1] - arrivals[0] > 0.1


BAD_INPUTS = [
    ("415 wrong content type", {"content": b"{}", "headers": {"content-type": "text/plain"}}, 415, None),
    ("400 bad json", {"content": b'{"model": ', "headers": {"content-type": "application/json"}}, 400, None),
    ("400 empty body", {"content": b"", "headers": {"content-type": "application/json"}}, 400, None),
    ("400 missing model", {"json": {"messages": [{"role": "user", "content": "x"}]}}, 400, "model"),
    (
        "400 bad role",
        {"json": {"model": "m", "messages": [{"role": "boss", "content": "x"}]}},
        400,
        "messages[0].role",
    ),
    ("400 bad temperature", {"json": chat(temperature=7)}, 400, "temperature"),
    ("400 stream not bool", {"json": chat(stream="yes")}, 400, "stream"),
    ("413 too large", {"json": chat("x" * 1_100_000)}, 413, None),
    ("422 too many tokens", {"json": chat("word " * 17_000)}, 422, "messages"),
]


@pytest.mark.parametrize(("case", "kwargs", "status", "param"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_each_bad_input_gets_its_status_and_a_json_error(
    client: httpx.Client,
    stack: Stack,
    case: str,
    kwargs: dict,
    status: int,
    param: str | None,  # type: ignore[type-arg]
) -> None:
    before = sim_state(stack, "primary")["served"]
    r = client.post(CHAT, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert r.headers["x-gate-request-id"]
    assert sim_state(stack, "primary")["served"] == before


def test_required_header_is_enforced_per_route(client: httpx.Client) -> None:
    body = {"model": "llama-3-8b", "prompt": "Say hi"}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "x-business-scene"
    r = client.post("/v1/completions", json=body, headers={"x-business-scene": "support"})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"].startswith("[llama-3-8b]")


def test_get_on_a_handled_path_is_405(client: httpx.Client) -> None:
    r = client.get(CHAT)
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"
