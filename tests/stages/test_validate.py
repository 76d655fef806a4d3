from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.cache.keys import question
from extproc.config import Validation
from extproc.exchange import Exchange
from extproc.ratelimit.keys import prompt_fingerprint
from extproc.request import last_user_text, prompt_texts
from extproc.stages.validate import RequestError, Validate, parse_request

CHAT = "/v1/chat/completions"
LIMITS = Validation()


def msg(content: object = "hi", role: str = "user") -> dict[str, object]:
    return {"role": role, "content": content}


def chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": [msg()], **fields}


BAD = [
    ("not an object", [1, 2], None),
    ("no model", {"messages": [msg()]}, "model"),
    ("blank model", chat(model="  "), "model"),
    ("model not a string", chat(model=3), "model"),
    ("no messages", {"model": "m"}, "messages"),
    ("empty messages", chat(messages=[]), "messages"),
    ("message not object", chat(messages=["hi"]), "messages[0]"),
    ("unknown role", chat(messages=[msg(role="root")]), "messages[0].role"),
    ("missing content", chat(messages=[{"role": "user"}]), "messages[0].content"),
    ("user content null", chat(messages=[msg(None)]), "messages[0].content"),
    ("content number", chat(messages=[msg(5)]), "messages[0].content"),
    ("part without type", chat(messages=[msg([{"text": "x"}])]), "messages[0].content[0]"),
    ("text part not str", chat(messages=[msg([{"type": "text", "text": 1}])]), "messages[0].content[0].text"),
    (
        "image without url",
        chat(messages=[msg([{"type": "image_url", "image_url": {}}])]),
        "messages[0].content[0].image_url.url",
    ),
    ("name not str", chat(messages=[{"role": "user", "content": "x", "name": 1}]), "messages[0].name"),
    ("stream not bool", chat(stream=1), "stream"),
    ("stream_options without stream", chat(stream_options={"include_usage": True}), "stream_options"),
    ("max_tokens zero", chat(max_tokens=0), "max_tokens"),
    ("max_tokens bool", chat(max_tokens=True), "max_tokens"),
    ("max_tokens float", chat(max_tokens=1.5), "max_tokens"),
    ("max_completion_tokens huge", chat(max_completion_tokens=10**9), "max_completion_tokens"),
    ("temperature high", chat(temperature=2.5), "temperature"),
    ("temperature string", chat(temperature="hot"), "temperature"),
    ("top_p high", chat(top_p=1.5), "top_p"),
    ("n zero", chat(n=0), "n"),
    ("stop five", chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("stop number", chat(stop=3), "stop"),
]


@pytest.mark.parametrize(("case", "payload", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_chat_bodies_name_the_field(case: str, payload: object, param: str | None) -> None:
    with pytest.raises(RequestError) as err:
        parse_request(orjson.dumps(payload), CHAT, LIMITS)
    assert err.value.status == 400
    assert err.value.param == param
    assert err.value.message


GOOD = [
    chat(),
    chat(stream=True, stream_options={"include_usage": True}, max_tokens=5, temperature=0, top_p=1, n=1),
    chat(messages=[msg("sys", "system"), msg("q"), {"role": "assistant", "content": None, "tool_calls": []}]),
    chat(
        messages=[msg([{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}])]
    ),
    chat(stop="\n"),
    chat(stop=["a", "b"], temperature=None),
]


@pytest.mark.parametrize("payload", GOOD)
def test_good_chat_bodies_parse(payload: dict[str, object]) -> None:
    assert parse_request(orjson.dumps(payload), CHAT, LIMITS)["model"] == "m"


@pytest.mark.parametrize(
    ("prompt", "ok"),
    [
        ("hi", True),
        (["a", "b"], True),
        ([1, 2, 3], True),
        ([[1, 2], [3]], True),
        ([], False),
        ([1, "a"], False),
        (None, False),
        ([[]], False),
    ],
)
def test_completion_prompt_shapes(prompt: object, ok: bool) -> None:
    body = orjson.dumps({"model": "m", "prompt": prompt})
    if ok:
        parse_request(body, "/v1/completions", LIMITS)
    else:
        with pytest.raises(RequestError) as err:
            parse_request(body, "/v1/completions", LIMITS)
        assert err.value.param == "prompt"


def test_body_over_the_limit_is_413() -> None:
    with pytest.raises(RequestError) as err:
        parse_request(b" " * 101, CHAT, Validation(max_body_bytes=100))
    assert err.value.status == 413


def test_prompt_texts_covers_messages_and_parts() -> None:
    payload = chat(messages=[msg("a"), msg([{"type": "text", "text": "b"}, {"type": "image_url"}])])
    assert prompt_texts(payload) == ["a", "b"]
    assert prompt_texts({"prompt": ["x", "y"]}) == ["x", "y"]
    assert prompt_texts({"prompt": [1, 2]}) == []


@given(st.binary(max_size=400))
def test_parsing_any_bytes_raises_only_request_errors(body: bytes) -> None:
    try:
        payload = parse_request(body, CHAT, LIMITS)
    except RequestError as exc:
        assert exc.status == 400 and exc.message
    else:
        assert isinstance(payload.get("model"), str)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(
    [
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "n",
        "stop",
        "prompt",
        "top_p",
        "role",
        "content",
        "type",
        "text",
    ]
)


@given(st.dictionaries(keys, json_values, max_size=6), st.sampled_from([CHAT, "/v1/completions"]))
def test_parsing_any_json_object_raises_only_request_errors(payload: dict[str, object], path: str) -> None:
    try:
        parse_request(orjson.dumps(payload), path, LIMITS)
    except RequestError as exc:
        assert exc.status == 400 and exc.message


def _message_with(values: st.DataObject) -> dict[str, object]:
    """A message whose every field may be any JSON value, including content parts."""
    part = st.fixed_dictionaries(
        {}, optional={"type": json_values | st.sampled_from(["text", "image_url"]), "text": json_values,
                      "image_url": json_values}
    )
    content = json_values | st.lists(part | json_values, max_size=3)
    role = json_values | st.sampled_from(["user", "assistant", "system"])
    return values.draw(
        st.fixed_dictionaries({}, optional={"role": role, "content": content, "name": json_values,
                                            "tool_calls": json_values})
    )


@given(st.data(), st.dictionaries(keys, json_values, max_size=4))
def test_any_json_value_in_any_message_field_is_a_request_error_or_a_usable_payload(
    data: st.DataObject, extra: dict[str, object]
) -> None:
    messages = [_message_with(data) for _ in range(data.draw(st.integers(1, 3)))]
    body = orjson.dumps({**extra, "model": "m", "messages": messages})
    try:
        payload = parse_request(body, CHAT, LIMITS)
    except RequestError as exc:
        assert exc.status == 400 and exc.message
        return
    # What passed is safe for every stage that reads the request's shape.
    assert all(isinstance(t, str) for t in prompt_texts(payload))
    assert isinstance(last_user_text(payload), str)
    question(payload, CHAT, "t", False)
    prompt_fingerprint(payload)
    orjson.dumps(payload)


@pytest.mark.parametrize(
    ("field", "value"),
    [("role", {"a": 1}), ("role", ["user"]), ("type", {"x": []}), ("type", ["text"])],
)
def test_unhashable_role_or_part_type_is_a_400_naming_the_field(field: str, value: object) -> None:
    if field == "role":
        payload = chat(messages=[{"role": value, "content": "hi"}])
        where = "messages[0].role"
    else:
        payload = chat(messages=[msg([{"type": value, "text": "x"}])])
        where = "messages[0].content[0]"
    with pytest.raises(RequestError) as err:
        parse_request(orjson.dumps(payload), CHAT, LIMITS)
    assert err.value.status == 400 and err.value.param == where


@pytest.mark.parametrize("depth", [65, 250, 1000])
def test_deep_nesting_is_a_400_not_a_failure_later(depth: int) -> None:
    nested: object = "x"
    for _ in range(depth):
        nested = [nested]
    with pytest.raises(RequestError) as err:
        parse_request(orjson.dumps(chat(tools=nested)) if depth < 255 else
                      b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":'
                      + b"[" * depth + b"]" * depth + b"}", CHAT, LIMITS)
    assert err.value.status == 400 and ("levels deep" in err.value.message or "JSON" in err.value.message)


def test_nesting_within_the_limit_passes() -> None:
    nested: object = "x"
    for _ in range(60):
        nested = [nested]
    assert parse_request(orjson.dumps(chat(tools=nested)), CHAT, LIMITS)["tools"] == nested


def _ex(method: str = "POST", **headers: str) -> Exchange:
    base = {"content-type": "application/json"}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    return Exchange(method=method, path=CHAT, headers=base)


async def test_header_checks() -> None:
    stage = Validate(LIMITS)
    assert await stage.on_headers(_ex()) is None
    assert (await stage.on_headers(_ex(content_type="application/json; charset=utf-8"))) is None
    reply = await stage.on_headers(_ex(content_type="text/plain"))
    assert reply is not None and reply.status == 415
    reply = await stage.on_headers(_ex(content_length=str(LIMITS.max_body_bytes + 1)))
    assert reply is not None and reply.status == 413
    reply = await stage.on_headers(_ex(method="PUT"))
    assert reply is not None and reply.status == 405
    error = orjson.loads(reply.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
