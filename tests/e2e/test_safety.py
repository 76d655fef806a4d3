"""The safety screen through a real Envoy: the sanitizer and the output guardrail."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from load.stack import Stack

CHAT = "/v1/chat/completions"


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    config = {
        "identity": {"api_keys": {"sk-fin": {"tenant": "finance"}, "sk-shop": {"tenant": "shop"}}},
        "guardrail": {"tenants": ["finance"]},
        "cache": {"shared_across_tenants": True},
    }
    with Stack(gate_config=config, sim_args=["--itl-ms", "5"]) as s:
        yield s


@pytest.fixture
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=20) as c:
        yield c


def test_hidden_characters_never_reach_the_model(client: httpx.Client) -> None:
    # The simulator answers with the prompt's first words: what it read, the client sees.
    r = client.post(CHAT, json=chat("hello\u200b gate\u202e \U000e0041\U000e0042sneaky\x00"))
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert content.startswith("[llama-3-8b] Answer to: hello gate sneaky")
    assert not any(ch in content for ch in "\u200b\u202e\U000e0041\U000e0042\x00")


FIN = {"authorization": "Bearer sk-fin"}
SHOP = {"authorization": "Bearer sk-shop"}
CARD = "4111 1111 1111 1111"


def streamed_text(client: httpx.Client, prompt: str, headers: dict[str, str]) -> tuple[str, httpx.Headers]:
    """The answer's text as an SSE client reads it, frame by frame."""
    text, done = "", False
    with client.stream("POST", CHAT, json=chat(prompt, stream=True), headers=headers) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
        assert done, "the stream ended without [DONE]"
        return text, r.headers


def metric(stack: Stack, name: str, **labels: str) -> float:
    page = httpx.get(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics").text
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def test_streamed_card_split_over_frames_reaches_the_guarded_tenant_redacted(
    client: httpx.Client, stack: Stack
) -> None:
    # The simulator streams the prompt's words back one frame each: the card spans four frames.
    before = metric(stack, "gate_guardrail_redactions_total", kind="card")
    text, headers = streamed_text(client, f"{CARD} is my card, stream", FIN)
    assert text.startswith("[llama-3-8b] Answer to: [redacted:card] is my card, stream")
    assert "4111" not in text and "1111" not in text
    assert headers["x-gate-cache"] == "miss"
    assert metric(stack, "gate_guardrail_redactions_total", kind="card") == before + 1


def test_json_answer_redacted_for_the_guarded_tenant_only(client: httpx.Client) -> None:
    prompt = "jane@corp.example.org 11010519491231002X"  # the simulator echoes 40 characters
    r = client.post(CHAT, json=chat(prompt), headers=FIN)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert content.startswith("[llama-3-8b] Answer to: [redacted:email] [redacted:cn_id] ")
    other = client.post(CHAT, json=chat(prompt + " shop"), headers=SHOP)
    assert other.json()["choices"][0]["message"]["content"].startswith(f"[llama-3-8b] Answer to: {prompt}")


def test_a_fullwidth_phone_number_in_a_chinese_stream_is_redacted(client: httpx.Client) -> None:
    # The simulator streams the prompt's words back one frame each.
    text, _ = streamed_text(client, "电话 １３８ ００１３ ８０００ 请回电", FIN)
    assert text.startswith("[llama-3-8b] Answer to: 电话 [redacted:phone] 请回电")
    assert "１３８" not in text and "８０００" not in text


def test_a_tenant_without_the_guardrail_gets_the_stream_unchanged(client: httpx.Client) -> None:
    text, _ = streamed_text(client, f"{CARD} unguarded", SHOP)
    assert text.startswith(f"[llama-3-8b] Answer to: {CARD} unguarded")


@pytest.mark.parametrize("stream", [True, False])
def test_cached_answer_replays_redacted(client: httpx.Client, stream: bool) -> None:
    # The cache is shared across tenants here: the shop's answer, cached unredacted, replays
    # to the finance tenant through the guardrail.
    prompt = f"{CARD} cached {'stream' if stream else 'json'}"
    if stream:
        first, _ = streamed_text(client, prompt, SHOP)
        assert CARD in first
        text, headers = streamed_text(client, prompt, FIN)
    else:
        first = client.post(CHAT, json=chat(prompt), headers=SHOP).json()["choices"][0]["message"]["content"]
        assert CARD in first
        r = client.post(CHAT, json=chat(prompt), headers=FIN)
        text, headers = r.json()["choices"][0]["message"]["content"], r.headers
    assert headers["x-gate-cache"] == "hit"
    assert text == first.replace(CARD, "[redacted:card]")
