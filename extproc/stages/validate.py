"""Request validation: content type, size, required headers, JSON and schema.

`parse_request` is pure: bytes in, a payload out, or `RequestError` with the status and the
field to blame. Nothing else may escape it (a Hypothesis property checks that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

import orjson

from ..config import Validation
from ..errors import error_reply
from ..exchange import Exchange, Reply
from .base import Stage

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
PART_TYPES = {"text", "image_url", "input_audio", "file", "refusal"}
CHAT_PATH = "/v1/chat/completions"


class RequestError(Exception):
    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code

    def reply(self) -> Reply:
        type_ = "invalid_request_error"
        return error_reply(self.status, self.message, type=type_, param=self.param, code=self.code)


def _one_of(value: Any, names: set[str]) -> TypeGuard[str]:
    """`value in names` for any JSON value (an object or array is unhashable)."""
    return isinstance(value, str) and value in names


def too_deep(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` (iterative: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def shown(value: Any, limit: int = 40) -> str:
    """A value as an error message may quote it: short, whatever the client sent."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(payload: dict[str, Any], name: str, low: float, high: float, *, integer: bool = False) -> None:
    if name not in payload or payload[name] is None:
        return
    value = payload[name]
    ok = _is_int(value) if integer else _is_number(value)
    kind = "an integer" if integer else "a number"
    if not ok or not low <= value <= high:
        raise RequestError(f"'{name}' must be {kind} between {low:g} and {high:g}; got {shown(value)}.", name)


def _check_content(content: Any, where: str, role: str) -> None:
    if isinstance(content, str):
        return
    if content is None and role in ("assistant", "function"):
        return
    if not isinstance(content, list):
        raise RequestError(f"'{where}' must be a string or an array of content parts.", where)
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        if not isinstance(part, dict) or not _one_of(part.get("type"), PART_TYPES):
            raise RequestError(
                f"'{here}' must be an object whose 'type' is one of {sorted(PART_TYPES)}.", here
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise RequestError(f"'{here}.text' must be a string.", f"{here}.text")
        if part["type"] == "image_url":
            image = part.get("image_url")
            if not isinstance(image, dict) or not isinstance(image.get("url"), str):
                raise RequestError(f"'{here}.image_url.url' must be a string.", f"{here}.image_url.url")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array of message objects.", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"'{where}' must be an object with 'role' and 'content'.", where)
        role = message.get("role")
        if not _one_of(role, ROLES):
            raise RequestError(
                f"'{where}.role' must be one of {sorted(ROLES)}; got {shown(role)}.", f"{where}.role"
            )
        if "content" not in message and not (role == "assistant" and "tool_calls" in message):
            raise RequestError(f"'{where}.content' is required.", f"{where}.content")
        _check_content(message.get("content"), f"{where}.content", role)
        if "name" in message and not isinstance(message["name"], str):
            raise RequestError(f"'{where}.name' must be a string.", f"{where}.name")


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or all(_is_int(p) for p in prompt):
            return
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return
    raise RequestError(
        "'prompt' must be a string, an array of strings, or an array of token arrays.", "prompt"
    )


def check_payload(payload: dict[str, Any], path: str, limits: Validation) -> None:
    """Raise `RequestError` naming the first bad field of an OpenAI request body."""
    model = payload.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestError("'model' is required and must be a non-empty string.", "model")
    if path == CHAT_PATH:
        _check_messages(payload.get("messages"))
    else:
        _check_prompt(payload.get("prompt"))
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false; got {stream!r}.", "stream")
    options = payload.get("stream_options")
    if options is not None:
        if not stream:
            raise RequestError("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        if not isinstance(options, dict):
            raise RequestError("'stream_options' must be an object.", "stream_options")
    for name in ("max_tokens", "max_completion_tokens"):
        _number(payload, name, 1, limits.max_output_tokens, integer=True)
    _number(payload, "temperature", 0, 2)
    _number(payload, "top_p", 0, 1)
    _number(payload, "n", 1, 128, integer=True)
    _number(payload, "presence_penalty", -2, 2)
    _number(payload, "frequency_penalty", -2, 2)
    stop = payload.get("stop")
    stop_ok = isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop)
    if stop is not None and not isinstance(stop, str) and not stop_ok:
        raise RequestError("'stop' must be a string or an array of at most 4 strings.", "stop")


def parse_request(body: bytes, path: str, limits: Validation) -> dict[str, Any]:
    """Parse and check a request body; raises only `RequestError`."""
    if not body:
        raise RequestError("The request body is empty; send a JSON object.", None)
    if len(body) > limits.max_body_bytes:
        raise RequestError(
            f"The request body is {len(body)} bytes; the limit is {limits.max_body_bytes}.",
            None,
            413,
            "request_too_large",
        )
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"The request body is not valid JSON: {exc}.", None) from None
    if not isinstance(payload, dict):
        raise RequestError("The request body must be a JSON object.", None)
    if too_deep(payload, limits.max_json_depth):
        raise RequestError(
            f"The request body nests arrays and objects more than {limits.max_json_depth} levels deep.", None
        )
    check_payload(payload, path, limits)
    return payload


class Validate(Stage):
    """415 / 413 / 400 on the headers, then JSON and schema on the body."""

    name = "validate"
    store_down = "not used"
    fail_closed = True

    def __init__(self, limits: Validation) -> None:
        self.limits = limits

    @classmethod
    def build(cls, config: Config, services: Services) -> Validate:
        return cls(config.validation)

    async def on_headers(self, ex: Exchange) -> Reply | None:
        if ex.method != "POST":
            return error_reply(
                405, f"{ex.route_path} accepts POST only; got {ex.method}.", code="method_not_allowed"
            )
        content_type = ex.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            shown = content_type or "none"
            return error_reply(
                415, f"Content-Type must be application/json; got {shown}.", code="unsupported_media_type"
            )
        length = ex.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.limits.max_body_bytes:
            return RequestError(
                f"The request body is {length} bytes; the limit is {self.limits.max_body_bytes}.",
                None,
                413,
                "request_too_large",
            ).reply()
        for rule in self.limits.required_headers:
            if ex.route_path.startswith(rule.path_prefix) and not ex.headers.get(rule.header):
                return error_reply(
                    400,
                    f"The header '{rule.header}' is required on {rule.path_prefix}.",
                    param=rule.header,
                    code="missing_required_header",
                )
        return None

    async def on_request(self, ex: Exchange) -> Reply | None:
        try:
            ex.payload = parse_request(ex.body, ex.route_path, self.limits)
        except RequestError as exc:
            return exc.reply()
        return None
