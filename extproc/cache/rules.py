"""Cacheability: what a request may read from the cache, and whether its answer may be kept.

Pure functions. A stored answer must be complete (a 2xx JSON body, or SSE that reached
`[DONE]` or a finish_reason), single-choice, free of tool calls unless the operator allows
them, and sampled at or below the configured temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# OpenAI's and vLLM's default temperature when the request sets none.
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True)
class Access:
    lookup: bool  # may be answered from the cache (or by an in-flight leader)
    store: bool  # its answer may be kept
    reason: str  # why not both, for the bypass metric ("" when both)

    @property
    def bypass(self) -> bool:
        return not (self.lookup or self.store)


def cache_control(headers: dict[str, str]) -> set[str]:
    directives = headers.get("cache-control", "").split(",")
    return {d.strip().split("=", 1)[0].lower() for d in directives if d.strip()}


def access(payload: dict[str, Any], headers: dict[str, str], max_temperature: float) -> Access:
    """What this request may do with the cache, from its body and `cache-control`."""
    n = payload.get("n")
    if isinstance(n, int) and n > 1:
        return Access(False, False, "n>1")
    best_of = payload.get("best_of")
    if isinstance(best_of, int) and best_of > 1:
        return Access(False, False, "best_of>1")
    temperature = payload.get("temperature")
    if temperature is None:
        temperature = DEFAULT_TEMPERATURE
    if isinstance(temperature, (int, float)) and temperature > max_temperature:
        return Access(False, False, "temperature")
    directives = cache_control(headers)
    lookup = "no-cache" not in directives
    store = "no-store" not in directives
    return Access(lookup, store, ",".join(sorted(directives & {"no-cache", "no-store"})))


def json_answer_ok(doc: Any, allow_tool_calls: bool) -> bool:
    """A whole JSON completion: one choice, finished, no tool call unless allowed."""
    if not isinstance(doc, dict) or "error" in doc:
        return False
    choices = doc.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if not choice.get("finish_reason"):
        return False
    message = choice.get("message")
    has_tools = isinstance(message, dict) and bool(message.get("tool_calls") or message.get("function_call"))
    return allow_tool_calls or not (has_tools or choice["finish_reason"] in ("tool_calls", "function_call"))


def sse_answer_ok(chunks: list[Any], done: bool, allow_tool_calls: bool) -> bool:
    """A whole event stream: reached [DONE] or a finish_reason, one choice, no tool call unless allowed."""
    finished = False
    for chunk in chunks:
        if not isinstance(chunk, dict) or "error" in chunk:
            return False
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                return False
            delta = choice.get("delta")
            tools = isinstance(delta, dict) and bool(delta.get("tool_calls") or delta.get("function_call"))
            if tools and not allow_tool_calls:
                return False
            reason = choice.get("finish_reason")
            if reason:
                if not allow_tool_calls and reason in ("tool_calls", "function_call"):
                    return False
                finished = True
    return (finished or done) and bool(chunks)
