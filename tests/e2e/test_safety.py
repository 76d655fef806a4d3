"""The safety screen through a real Envoy: the sanitizer and the output guardrail."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from load.stack import Stack

CHAT = "/v1/chat/completions"


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    config = {
        "identity": {"api_keys": {"sk-fin": {"tenant": "finance"}, "sk-shop": {"tenant": "shop"}}},
        "guardrail": {"tenants": ["finance"]},
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
