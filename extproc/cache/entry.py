"""A stored answer, and the capture that builds one from the upstream body chunk by chunk.

Every stored answer carries `usage`, so every answer served from it can: the upstream's own
(the JSON body's `usage`, or a stream's usage chunk), else counted by the gate's tokenizer
(the prompt's count from the exchange, the answer's text counted here) and marked
`"estimated": true` inside `usage`. A stream stored without one gets the usage chunk OpenAI
sends (`choices: []`), just before `[DONE]`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ..tokens import PER_MESSAGE_OVERHEAD, TokenCounter
from .rules import json_answer_ok, sse_answer_ok

Kind = Literal["json", "sse"]
DONE = "[DONE]"
Count = Callable[[list[str]], int]  # TokenCounter.count: tokens of texts, plus a per-text overhead


@functools.cache
def default_counter() -> TokenCounter:
    return TokenCounter()


@dataclass(frozen=True)
class Entry:
    kind: Kind
    body: str  # json: the whole body
    events: tuple[tuple[float, str], ...]  # sse: (seconds after the first event, data payload)
    text: str  # the question it answers, as asked (the decision compares against it)
    model: str
    tenant: str
    stored_at: float
    source: str = ""  # set on an alias: the key of the entry a paraphrase was answered from
    similarity: float = 1.0  # the alias's similarity to its source

    def dump(self) -> bytes:
        return orjson.dumps(
            {"k": self.kind, "b": self.body, "e": self.events, "t": self.text, "m": self.model,
             "n": self.tenant, "at": self.stored_at, "src": self.source, "sim": self.similarity}
        )

    @classmethod
    def load(cls, raw: bytes) -> Entry:
        d = orjson.loads(raw)
        return cls(
            kind=d["k"], body=d["b"], events=tuple((float(t), str(p)) for t, p in d["e"]), text=d["t"],
            model=d["m"], tenant=d["n"], stored_at=float(d["at"]), source=d.get("src", ""),
            similarity=float(d.get("sim", 1.0)),
        )


def content_kind(content_type: str) -> Kind | None:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json":
        return "json"
    if media == "text/event-stream":
        return "sse"
    return None


def frame_data(frame: bytes) -> str | None:
    """The data of one SSE event (several `data:` lines join with newlines), or None."""
    lines = [ln[5:].removeprefix(b" ") for ln in frame.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines).decode("utf-8", "replace") if lines else None


@dataclass
class Capture:
    """Collect an upstream body; SSE events are reassembled across chunk boundaries."""

    kind: Kind
    max_bytes: int
    clock: Callable[[], float] = time.monotonic
    prompt_tokens: int = 0  # the exchange's count (prompt-limit stage), for an estimated usage
    count: Count | None = None  # the gate's tokenizer; None: the default TokenCounter
    size: int = 0
    overflow: bool = False
    _buf: bytearray = field(default_factory=bytearray)
    _events: list[tuple[float, str]] = field(default_factory=list)
    _first: float | None = None
    _done: bool = False

    def feed(self, chunk: bytes) -> None:
        if self.overflow or not chunk:
            return
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.overflow = True
            self._buf.clear()
            self._events.clear()
            self._done = False
            return
        self._buf += chunk.replace(b"\r\n", b"\n") if self.kind == "sse" else chunk
        if self.kind == "sse":
            self._split()

    def _split(self) -> None:
        while (cut := self._buf.find(b"\n\n")) >= 0:
            frame = bytes(self._buf[:cut])
            del self._buf[: cut + 2]
            data = frame_data(frame)
            if data is None:
                continue
            now = self.clock()
            self._first = now if self._first is None else self._first
            self._events.append((round(now - self._first, 4), data))
            self._done = self._done or data == DONE

    @property
    def complete(self) -> bool:
        """The stream has sent `[DONE]`: nothing after it changes the answer, so it can be stored
        before that last event reaches the client (a client stops reading at `[DONE]`)."""
        return self.kind == "sse" and not self.overflow and self._done

    def finish(self, allow_tool_calls: bool) -> tuple[str, tuple[tuple[float, str], ...]] | None:
        """(body, events) when the answer is complete and may be kept, else None; with `usage`."""
        if self.overflow:
            return None
        if self.kind == "json":
            try:
                doc: Any = orjson.loads(bytes(self._buf))
            except orjson.JSONDecodeError:
                return None
            if not json_answer_ok(doc, allow_tool_calls):
                return None
            if isinstance(doc.get("usage"), dict):
                return bytes(self._buf).decode(), ()
            doc["usage"] = self._estimate(json_text(doc))
            return orjson.dumps(doc).decode(), ()
        if self._buf.strip():
            self._buf += b"\n\n"  # a last event without its blank line still counts
            self._split()
        done = any(data == DONE for _, data in self._events)
        chunks: list[Any] = []
        for _, data in self._events:
            if data == DONE:
                continue
            try:
                chunks.append(orjson.loads(data))
            except orjson.JSONDecodeError:
                return None
        if not sse_answer_ok(chunks, done, allow_tool_calls):
            return None
        if any(isinstance(c.get("usage"), dict) for c in chunks):
            return "", tuple(self._events)
        return "", self._with_usage_chunk(chunks)

    def _with_usage_chunk(self, chunks: list[dict[str, Any]]) -> tuple[tuple[float, str], ...]:
        first = chunks[0]
        head = {k: first.get(k) for k in ("id", "object", "created", "model")}
        usage = orjson.dumps({**head, "choices": [], "usage": self._estimate(chunks_text(chunks))}).decode()
        events = [e for e in self._events if e[1] != DONE]
        return (*events, (events[-1][0], usage), *(e for e in self._events if e[1] == DONE))

    def _estimate(self, text: str) -> dict[str, Any]:
        count = self.count or default_counter().count
        completion = max(0, count([text]) - PER_MESSAGE_OVERHEAD) if text else 0
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion, "estimated": True}


def json_text(doc: dict[str, Any]) -> str:
    """The answer's text in a JSON completion: content or text, and any tool-call arguments."""
    pieces: list[str] = []
    for choice in doc.get("choices") or []:
        message = choice.get("message") or {}
        pieces.append(str(choice.get("text") or message.get("content") or ""))
        pieces += [_arguments(c) for c in message.get("tool_calls") or []]
    return "".join(pieces)


def chunks_text(chunks: list[dict[str, Any]]) -> str:
    """The answer's text in stream chunks: the deltas (or text) joined, tool-call arguments too."""
    pieces: list[str] = []
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            pieces.append(str(choice.get("text") or delta.get("content") or ""))
            pieces += [_arguments(c) for c in delta.get("tool_calls") or []]
    return "".join(pieces)


def _arguments(call: dict[str, Any]) -> str:
    return str((call.get("function") or {}).get("arguments") or "")
