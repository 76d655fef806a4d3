"""OpenAI-style error replies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import orjson

from .exchange import Reply

SHOULD_RETRY = "x-should-retry"  # "false": OpenAI's SDKs then do not retry


def unavailable_reply(what: str, code: str, decision: str) -> Reply:
    """A check the route requires could not run (its store is down): a retryable 503."""
    return error_reply(
        503,
        f"{what} cannot be checked now and this route requires it. Retry in a second.",
        type="service_unavailable",
        code=code,
        headers={"retry-after": "1"},
        decision=decision,
    )


def error_reply(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    decision: str = "reject",
    extra: dict[str, object] | None = None,
) -> Reply:
    """`extra` adds fields to the error object (e.g. `eta_ms` of an overloaded reply)."""
    error = {"message": message, "type": type, "param": param, "code": code, **(extra or {})}
    body = orjson.dumps({"error": error})
    all_headers = {"content-type": "application/json"}
    all_headers.update(headers or {})
    return Reply(status=status, body=body, headers=all_headers, decision=decision)
