from __future__ import annotations

from typing import Any

import orjson
import pytest

from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.stages.sanitize import Sanitize


def exchange(payload: dict[str, Any]) -> Exchange:
    ex = Exchange(method="POST", path="/v1/chat/completions", headers={})
    ex.body = orjson.dumps(payload)
    ex.payload = orjson.loads(ex.body)
    return ex


HIDDEN_CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be kind\u200b"},
        {"role": "user", "content": [{"type": "text", "text": "hi\U000e0041\U000e0042"},
                                     {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "user", "content": "what is 2+2?\x00\u202e"},
    ],
}


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_strip_rewrites_every_message_and_the_body() -> None:
    metrics = Metrics()
    ex = exchange(HIDDEN_CHAT)
    assert await Sanitize("strip", metrics).on_request(ex) is None
    assert ex.upstream_body is not None
    sent = orjson.loads(ex.upstream_body)
    assert ex.payload == sent
    assert [m["content"] for m in sent["messages"]][::2] == ["be kind", "what is 2+2?"]
    assert sent["messages"][1]["content"][0]["text"] == "hi"
    assert sent["messages"][1]["content"][1] == HIDDEN_CHAT["messages"][1]["content"][1]
    assert sample(metrics, "gate_sanitized_chars_total", kind="tag") == 2
    assert sample(metrics, "gate_sanitized_chars_total", kind="zero_width") == 1
    assert sample(metrics, "gate_sanitized_chars_total", kind="control") == 1
    assert sample(metrics, "gate_sanitized_chars_total", kind="bidi") == 1
    assert sample(metrics, "gate_sanitized_requests_total", action="stripped") == 1


async def test_clean_prompt_keeps_the_body_as_sent() -> None:
    ex = exchange({"model": "m", "messages": [{"role": "user", "content": "👍\ufe0f 你好"}]})
    assert await Sanitize("strip", Metrics()).on_request(ex) is None
    assert ex.upstream_body is None


@pytest.mark.parametrize("prompt", ["a\u200bb", ["x", "a\u200bb"]])
async def test_completions_prompt(prompt: object) -> None:
    ex = exchange({"model": "m", "prompt": prompt})
    await Sanitize("strip", Metrics()).on_request(ex)
    assert ex.upstream_body is not None
    sent = orjson.loads(ex.upstream_body)["prompt"]
    assert sent == ("ab" if isinstance(prompt, str) else ["x", "ab"])


async def test_reject_answers_400_without_quoting_the_text() -> None:
    metrics = Metrics()
    ex = exchange(HIDDEN_CHAT)
    reply = await Sanitize("reject", metrics).on_request(ex)
    assert reply is not None and reply.status == 400
    error = orjson.loads(reply.body)["error"]
    assert error["code"] == "hidden_characters"
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages[0].content"
    assert "1 zero_width" in error["message"] and "2 tag" in error["message"]
    assert "be kind" not in error["message"]
    assert ex.upstream_body is None
    assert sample(metrics, "gate_sanitized_requests_total", action="rejected") == 1


async def test_off_does_not_run() -> None:
    stage = Sanitize("off", Metrics())
    assert not stage.runs("on_request")
