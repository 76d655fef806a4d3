"""A stored answer, and the capture that builds one from the upstream body chunk by chunk."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .rules import json_answer_ok, sse_answer_ok

Kind = Literal["json", "sse"]
DONE = "[DONE]"


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
    size: int = 0
    overflow: bool = False
    _buf: bytearray = field(default_factory=bytearray)
    _events: list[tuple[float, str]] = field(default_factory=list)
    _first: float | None = None

    def feed(self, chunk: bytes) -> None:
        if self.overflow or not chunk:
            return
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.overflow = True
            self._buf.clear()
            self._events.clear()
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

    def finish(self, allow_tool_calls: bool) -> tuple[str, tuple[tuple[float, str], ...]] | None:
        """(body, events) when the answer is complete and may be kept, else None."""
        if self.overflow:
            return None
        if self.kind == "json":
            try:
                doc: Any = orjson.loads(bytes(self._buf))
            except orjson.JSONDecodeError:
                return None
            return (bytes(self._buf).decode(), ()) if json_answer_ok(doc, allow_tool_calls) else None
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
        return "", tuple(self._events)
