"""Replay a stored answer in the caller's framing: JSON or SSE, with a fresh id and created.

Pure: an Entry in, (content type, body) out. SSE → JSON joins the deltas; JSON → SSE sends
the whole message as one delta, then the finish, the usage when asked for, and `[DONE]`.
A stream carries usage as OpenAI's does: with `stream_options.include_usage`, `"usage": null`
on every chunk and one last chunk with `choices: []` and the usage; without it, no usage at all
(whatever the stream that was stored carried: `stream_options` is not part of the key).
"""

from __future__ import annotations

from typing import Any

import orjson

from .entry import DONE, Entry

JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream"


def _frame(doc: Any) -> bytes:
    return b"data: " + (doc.encode() if isinstance(doc, str) else orjson.dumps(doc)) + b"\n\n"


def _is_chat(doc: dict[str, Any]) -> bool:
    return str(doc.get("object", "")).startswith("chat.")


def replay(entry: Entry, stream: bool, include_usage: bool, rid: str, created: int) -> tuple[str, bytes]:
    if entry.kind == "json":
        doc = orjson.loads(entry.body)
        doc["id"], doc["created"] = rid, created
        if not stream:
            return JSON_TYPE, orjson.dumps(doc)
        return SSE_TYPE, b"".join(_frame(c) for c in json_to_chunks(doc, include_usage)) + _frame(DONE)
    chunks = [orjson.loads(data) for _, data in entry.events if data != DONE]
    for chunk in chunks:
        chunk["id"], chunk["created"] = rid, created
    if not stream:
        return JSON_TYPE, orjson.dumps(chunks_to_json(chunks))
    return SSE_TYPE, b"".join(_frame(c) for c in stream_usage(chunks, include_usage)) + _frame(DONE)


def stream_usage(chunks: list[dict[str, Any]], include_usage: bool) -> list[dict[str, Any]]:
    """The answer's chunks with usage as the caller asked for it (the last usage seen counts)."""
    usage = next((c["usage"] for c in reversed(chunks) if isinstance(c.get("usage"), dict)), None)
    out = [{k: v for k, v in c.items() if k != "usage"} for c in chunks if c.get("choices")]
    if not include_usage:
        return out
    for chunk in out:
        chunk["usage"] = None
    if usage is not None and out:
        head = {k: out[-1].get(k) for k in ("id", "object", "created", "model")}
        out.append({**head, "choices": [], "usage": usage})
    return out


def json_to_chunks(doc: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    chat = _is_chat(doc)
    head = {"id": doc.get("id"), "object": "chat.completion.chunk" if chat else "text_completion",
            "created": doc.get("created"), "model": doc.get("model")}
    choice = doc["choices"][0]
    first: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None}
    last: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": choice.get("finish_reason")}
    if chat:
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role", "assistant"), "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        first["delta"], last["delta"] = delta, {}
    else:
        first["text"], last["text"] = choice.get("text", ""), ""
    chunks = [{**head, "choices": [first]}, {**head, "choices": [last], "usage": doc.get("usage")}]
    return stream_usage(chunks, include_usage)


def _merge_tool_call(calls: dict[int, dict[str, Any]], part: dict[str, Any]) -> None:
    call = calls.setdefault(int(part.get("index", 0)), {"function": {"name": "", "arguments": ""}})
    for key in ("id", "type"):
        if part.get(key):
            call[key] = part[key]
    function = part.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def chunks_to_json(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    first = chunks[0] if chunks else {}
    chat = _is_chat(first)
    pieces: list[str] = []
    role, finish, usage = "assistant", None, None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for part in chunk.get("choices") or []:
            finish = part.get("finish_reason") or finish
            if not chat:
                pieces.append(part.get("text") or "")
                continue
            delta = part.get("delta") or {}
            role = delta.get("role") or role
            pieces.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                _merge_tool_call(calls, call)
    text = "".join(pieces)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        message: dict[str, Any] = {"role": role, "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        choice["message"] = message
    else:
        choice["text"] = text
    doc: dict[str, Any] = {"id": first.get("id"), "object": "chat.completion" if chat else "text_completion",
                           "created": first.get("created"), "model": first.get("model"), "choices": [choice]}
    if usage:
        doc["usage"] = usage
    return doc
