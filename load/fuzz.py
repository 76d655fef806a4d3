"""Fuzzed request bodies: arbitrary JSON values in every field of a chat request.

`body(rng)` returns bytes: mostly a chat request whose fields (and the fields of its
messages and content parts) are replaced by arbitrary JSON values — nulls, booleans, huge
and negative integers, floats at the edge of double range, unicode (NUL, surrogates'
neighbours, RTL, emoji), deep nesting (up to ~1,100 levels), huge arrays — and sometimes
bytes that are no JSON at all. Pure; the drills send them through Envoy.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

FIELDS = ("model", "messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stream",
          "stream_options", "n", "stop", "tools", "tool_choice", "response_format", "user", "seed",
          "logit_bias", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "prompt")
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
PART_FIELDS = ("type", "text", "image_url")
STRINGS = ("", "user", "assistant", "system", "tool", "text", "image_url", "llama-3-8b", "phi-3",
           "\x00", "a\x00b", "\u202eevil", "😀" * 50, "紧急 退款", "\ud7ff\ue000", "\\u0000",
           "x" * 5000, " " * 100, "null", "{}", "[]", "-1", "1e309")
NUMBERS: tuple[Any, ...] = (0, -1, 1, 2**31, 2**63 - 1, -(2**63), 1.5, -0.0, 1e308, -1e308, 5e-324, 9, 2.0,
                            10**20)


def scalar(rng: random.Random) -> Any:
    k = rng.randrange(5)
    if k == 0:
        return None
    if k == 1:
        return rng.random() < 0.5
    if k == 2:
        return rng.choice(NUMBERS)
    if k == 3:
        return rng.choice(STRINGS)
    return "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0xD7FF),
                                    rng.randrange(0xE000, 0x10FFFF)))) for _ in range(rng.randrange(1, 40)))


def value(rng: random.Random, depth: int = 0) -> Any:
    """An arbitrary JSON value: a scalar, a small container, a deep nest or a huge array."""
    k = rng.randrange(40)
    if depth > 3 or k < 22:
        return scalar(rng)
    if k < 28:
        return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if k < 34:
        return {rng.choice(STRINGS + FIELDS): value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if k < 37:
        return nest(rng.choice((10, 200, 254, 256, 600, 1_100)), rng)
    if k in (37, 38) and rng.random() < 0.7:  # keep huge bodies a few percent of all
        return scalar(rng)
    if k == 37:
        return [rng.choice(NUMBERS)] * rng.choice((1_000, 20_000))
    if k == 38:
        return [{"role": "user", "content": "hi"}] * rng.choice((500, 5_000))
    return {"type": value(rng, depth + 1), "text": value(rng, depth + 1)}


class Deep:
    """`levels` of nested arrays and objects around a scalar, kept as JSON text."""

    def __init__(self, levels: int, rng: random.Random) -> None:
        opens = [b"[" if rng.random() < 0.5 else b'{"a":' for _ in range(levels)]
        closes = [b"]" if o == b"[" else b"}" for o in reversed(opens)]
        self.json = b"".join(opens) + _by_hand(scalar(rng)) + b"".join(closes)


def nest(levels: int, rng: random.Random) -> Any:
    return Deep(levels, rng)


def _dumps(doc: Any) -> bytes:
    try:
        return orjson.dumps(doc)
    except (orjson.JSONEncodeError, TypeError):  # deeper than orjson writes: by hand
        return _by_hand(doc)


def _by_hand(doc: Any) -> bytes:
    if isinstance(doc, Deep):
        return doc.json
    try:
        return orjson.dumps(doc)
    except (orjson.JSONEncodeError, TypeError):  # a Deep or a huge int inside: part by part
        pass
    if isinstance(doc, list):
        return b"[" + b",".join(_by_hand(x) for x in doc) + b"]"
    if isinstance(doc, dict):
        return b"{" + b",".join(orjson.dumps(str(k)) + b":" + _by_hand(v) for k, v in doc.items()) + b"}"
    return str(doc).encode()  # an int beyond 64 bits


def message(rng: random.Random) -> Any:
    msg: dict[str, Any] = {"role": "user", "content": "fuzz " + str(rng.randrange(10**6))}
    for f in MESSAGE_FIELDS:
        if rng.random() < 0.3:
            msg[f] = value(rng)
    if rng.random() < 0.3:
        parts = []
        for _ in range(rng.randrange(1, 4)):
            part: dict[str, Any] = {"type": "text", "text": "part"}
            for f in PART_FIELDS:
                if rng.random() < 0.4:
                    part[f] = value(rng)
            parts.append(part)
        msg["content"] = parts
    return msg if rng.random() < 0.95 else value(rng)


def body(rng: random.Random) -> bytes:
    k = rng.random()
    if k < 0.03:  # not JSON at all
        return rng.choice((b"", b"{", b"\x00\xff\xfe", b'{"model": "llama-3-8b", "messages": [',
                           "{\"a\": \"\ud800\"}".encode("utf-8", "surrogatepass"), b"NaN", b"1e999999"))
    if k < 0.08:  # any JSON value as the whole body
        return _dumps(value(rng))
    doc: dict[str, Any] = {"model": "llama-3-8b",
                           "messages": [message(rng) for _ in range(rng.randrange(1, 4))],
                           "max_tokens": 4}
    for f in FIELDS:
        if rng.random() < 0.15:
            doc[f] = value(rng)
    if rng.random() < 0.02:
        doc["temperature"] = 10**30  # beyond every double-precision check written as int
    return _dumps(doc)


MALFORMED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("role", {"model": "llama-3-8b", "messages": [{"role": {"x": 1}, "content": "hi"}]}),
    ("role", {"model": "llama-3-8b", "messages": [{"role": ["user"], "content": "hi"}]}),
    ("type", {"model": "llama-3-8b", "messages": [{"role": "user", "content": [{"type": ["text"],
                                                                                  "text": "hi"}]}]}),
    ("type", {"model": "llama-3-8b", "messages": [{"role": "user", "content": [{"type": {"t": 1},
                                                                                  "text": "hi"}]}]}),
)
