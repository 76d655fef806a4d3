"""OpenAI-style error replies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import orjson

from .exchange import Reply


def error_reply(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    decision: str = "reject",
) -> Reply:
    body = orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})
    all_headers = {"content-type": "application/json"}
    all_headers.update(headers or {})
    return Reply(status=status, body=body, headers=all_headers, decision=decision)
