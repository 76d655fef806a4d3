"""Scope and keys (what may share an answer) and the cacheability rules, as tables."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.cache.keys import exact_key, normalise, question
from extproc.cache.rules import access, json_answer_ok, sse_answer_ok

CHAT = "/v1/chat/completions"


def chat(last: str = "What is the capital of France?", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": last}]
    return {"model": "llama-3-8b", "messages": messages, **extra}


def key(payload: dict[str, Any], tenant: str = "acme", path: str = CHAT, shared: bool = False) -> str:
    return exact_key(question(payload, path, tenant, shared))


BASE = chat()
SAME_KEY = [
    ("stream flag", chat(stream=True, stream_options={"include_usage": True})),
    ("user field", chat(user="u-42")),
    ("case and spaces", chat("  what is the CAPITAL   of france? ")),
    ("full-width letters", chat("What is the capital of Ｆｒａｎｃｅ?")),
    ("content as text parts", chat([{"type": "text", "text": "What is the capital of France?"}])),  # type: ignore[arg-type]
]
OTHER_KEY = [
    ("another question", chat("What is the capital of Spain?")),
    ("model", {**chat(), "model": "phi-3-mini"}),
    ("temperature", chat(temperature=0.2)),
    ("max_tokens", chat(max_tokens=5)),
    ("seed", chat(seed=1)),
    ("tool schema", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])),
    (
        "system prompt",
        {
            **chat(),
            "messages": [
                {"role": "system", "content": "Be verbose."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
        },
    ),
    (
        "earlier turn",
        {
            **chat(),
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "What is the capital of France?"},
            ],
        },
    ),
    ("negation", chat("What is not the capital of France?")),
    ("number", chat("What was the capital of France in 1900?")),
]


@pytest.mark.parametrize(("case", "payload"), SAME_KEY, ids=[c for c, _ in SAME_KEY])
def test_framing_and_spelling_do_not_change_the_key(case: str, payload: dict[str, Any]) -> None:
    assert key(payload) == key(BASE)


@pytest.mark.parametrize(("case", "payload"), OTHER_KEY, ids=[c for c, _ in OTHER_KEY])
def test_anything_that_changes_the_answer_changes_the_key(case: str, payload: dict[str, Any]) -> None:
    assert key(payload) != key(BASE)


def test_tenants_are_separate_unless_shared_and_paths_always() -> None:
    assert key(BASE, "acme") != key(BASE, "globex")
    assert key(BASE, "acme", shared=True) == key(BASE, "globex", shared=True)
    assert key({"model": "m", "prompt": "x"}, path="/v1/completions") != key(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )


def test_only_a_plain_last_user_message_is_compared() -> None:
    assert question(BASE, CHAT, "t", False).text == "What is the capital of France?"
    image = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert question(chat(image), CHAT, "t", False).text is None  # type: ignore[arg-type]
    tool_turn = {
        **BASE,
        "messages": [*BASE["messages"], {"role": "tool", "content": "42", "tool_call_id": "c"}],
    }
    assert question(tool_turn, CHAT, "t", False).text is None
    assert question({"model": "m", "prompt": [1, 2, 3]}, "/v1/completions", "t", False).text is None
    assert key({"model": "m", "prompt": [1, 2, 3]}) != key({"model": "m", "prompt": [1, 2, 4]})


@given(st.text(max_size=40), st.text(max_size=40))
def test_key_equality_is_normalised_text_equality(a: str, b: str) -> None:
    assert (key(chat(a)) == key(chat(b))) == (normalise(a) == normalise(b))


ACCESS = [
    ("plain", {}, {}, (True, True)),
    ("no-cache reads nothing but stores", {}, {"cache-control": "no-cache"}, (False, True)),
    ("no-store may read but keeps nothing", {}, {"cache-control": "no-store"}, (True, False)),
    ("both", {}, {"cache-control": "No-Store, no-cache"}, (False, False)),
    ("n > 1", {"n": 2}, {}, (False, False)),
    ("n = 1", {"n": 1}, {}, (True, True)),
    ("temperature above the bound", {"temperature": 1.2}, {}, (False, False)),
    ("temperature at the bound", {"temperature": 0.7}, {}, (True, True)),
]


@pytest.mark.parametrize(("case", "extra", "headers", "expected"), ACCESS, ids=[a[0] for a in ACCESS])
def test_access(
    case: str, extra: dict[str, Any], headers: dict[str, str], expected: tuple[bool, bool]
) -> None:
    got = access(chat(**extra), headers, max_temperature=1.0 if "bound" not in case else 0.7)
    assert (got.lookup, got.store) == expected


def test_no_temperature_counts_as_one() -> None:
    assert access(chat(), {}, 0.5).bypass
    assert not access(chat(), {}, 1.0).bypass


def message(**extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}
    return {"object": "chat.completion", "choices": [{**choice, **extra}]}


JSON_ANSWERS = [
    ("complete", message(), False, True),
    ("no finish", message(finish_reason=None), False, False),
    (
        "tool call",
        message(message={"role": "assistant", "tool_calls": [{"id": "1"}]}, finish_reason="tool_calls"),
        False,
        False,
    ),
    (
        "tool call allowed",
        message(message={"role": "assistant", "tool_calls": [{"id": "1"}]}, finish_reason="tool_calls"),
        True,
        True,
    ),
    ("two choices", {"choices": [message()["choices"][0]] * 2}, False, False),
    ("an error body", {"error": {"message": "x"}}, False, False),
]


@pytest.mark.parametrize(("case", "doc", "tools", "ok"), JSON_ANSWERS, ids=[j[0] for j in JSON_ANSWERS])
def test_json_answers(case: str, doc: Any, tools: bool, ok: bool) -> None:
    assert json_answer_ok(doc, tools) is ok


def delta(content: str | None = "x", finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content, **extra}, "finish_reason": finish}]}


SSE_ANSWERS = [
    ("finished and done", [delta(), delta(None, "stop")], True, True),
    ("finished, no [DONE]", [delta(), delta(None, "length")], False, True),
    ("cut short", [delta(), delta()], False, False),
    ("tool call delta", [delta(None, tool_calls=[{"index": 0}]), delta(None, "tool_calls")], True, False),
    ("nothing", [], True, False),
    ("second choice", [{"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]}], True, False),
]


@pytest.mark.parametrize(("case", "chunks", "done", "ok"), SSE_ANSWERS, ids=[s[0] for s in SSE_ANSWERS])
def test_sse_answers(case: str, chunks: list[Any], done: bool, ok: bool) -> None:
    assert sse_answer_ok(chunks, done, allow_tool_calls=False) is ok
