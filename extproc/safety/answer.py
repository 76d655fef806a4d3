"""Redaction of a whole answer body, JSON or SSE, fed chunk by chunk.

`AnswerFilter.feed(chunk, end)` returns the bytes to send on in place of `chunk`. A JSON
answer is held until its end (it is parsed whole). A stream goes on event by event: each
choice's text, and apart from it its reasoning text, runs through a `TextStream`, which
holds back only the tail that more text could still turn into personal data
(`redact.holdback`); the rest of each event's text goes out at once, redacted. What is
held goes out with the choice's finishing event, or before `[DONE]`, or at the end of the
body.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

import orjson

from .redact import ALL_KINDS, apply, find, holdback, redact

TEXT_FIELDS = ("content", "reasoning_content", "reasoning")  # a chat message's (or delta's) texts


class TextStream:
    """One choice's text as it streams: what may go out now, what must wait."""

    def __init__(self, kinds: Collection[str], counts: Counter[str]) -> None:
        self.kinds = kinds
        self.counts = counts
        self.pending = ""

    def feed(self, text: str) -> str:
        self.pending += text
        pending = self.pending
        spans = find(pending, self.kinds)
        cut = len(pending) - holdback(pending, self.kinds)
        for start, end, _ in spans:  # never cut through a match: it goes out whole or waits
            if start < cut < end:
                cut = start
        done = [s for s in spans if s[1] <= cut]
        self.pending = pending[cut:]
        self.counts.update(kind for _, _, kind in done)
        return apply(pending[:cut], done)

    def flush(self) -> str:
        text, counts = redact(self.pending, self.kinds)
        self.counts.update(counts)
        self.pending = ""
        return text


def _text_slots(choice: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """Where a streamed choice carries its texts: chat's delta (its content and reasoning),
    completions' text."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta, TEXT_FIELDS
    if "text" in choice:
        return choice, ("text",)
    return None


def _without_logprobs(choice: dict[str, Any]) -> bool:
    """Drop a choice's log probabilities: their tokens spell the text out, redacted or not."""
    if choice.get("logprobs") is None:
        return False
    choice["logprobs"] = None
    return True


class AnswerFilter:
    """The body filter of one answer; `counts` holds the redactions made so far, by kind."""

    def __init__(self, kind: str, kinds: Collection[str] = ALL_KINDS) -> None:
        self.kind = kind  # "json" or "sse"
        self.kinds = kinds
        self.counts: Counter[str] = Counter()  # since its reader last cleared it
        self._buf = bytearray()
        self._streams: dict[tuple[int, str], TextStream] = {}  # by choice index and field
        self._template: dict[str, Any] | None = None  # the last event, for a closing one

    def feed(self, chunk: bytes, end: bool) -> bytes:
        self._buf += chunk
        if self.kind == "json":
            return self._json() if end else b""
        out = bytearray()
        while True:
            at = self._event_end()
            if at is None:
                break
            event, self._buf = bytes(self._buf[:at]), self._buf[at:]
            out += self._event(event)
        if end:
            rest, self._buf = bytes(self._buf), bytearray()
            out += self._closing() + (self._raw(rest) if rest else b"")
        return bytes(out)

    # ------------------------------------------------------------------ JSON

    def _json(self) -> bytes:
        body, self._buf = bytes(self._buf), bytearray()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._raw(body)
        choices = doc.get("choices") if isinstance(doc, dict) else None
        changed = False
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            changed |= _without_logprobs(choice)
            message = choice.get("message")
            holder = message if isinstance(message, dict) else choice
            for name in (*TEXT_FIELDS, "text"):
                value = holder.get(name)
                if isinstance(value, str):
                    text, counts = redact(value, self.kinds)
                    if counts:
                        holder[name] = text
                        self.counts.update(counts)
                        changed = True
        return orjson.dumps(doc) if changed else body

    def _raw(self, body: bytes) -> bytes:
        """A body that is not what an answer should be: redacted as plain text."""
        text, counts = redact(body.decode("utf-8", "surrogateescape"), self.kinds)
        self.counts.update(counts)
        return text.encode("utf-8", "surrogateescape")

    # ------------------------------------------------------------------ SSE

    def _event_end(self) -> int | None:
        """The end of the first whole event in the buffer (after its blank line), if any."""
        ends = [i + n for sep, n in ((b"\n\n", 2), (b"\r\n\r\n", 4)) if (i := self._buf.find(sep)) >= 0]
        return min(ends) if ends else None

    def _event(self, event: bytes) -> bytes:
        lines = event.replace(b"\r\n", b"\n").rstrip(b"\n").split(b"\n")
        data = [ln[5:].lstrip(b" ") for ln in lines if ln.startswith(b"data:")]
        if not data:
            return event
        payload = b"\n".join(data)
        if payload.strip() == b"[DONE]":
            return self._closing() + event
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self._raw(event)
        if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
            return self._raw(event)
        changed = False
        for choice in doc["choices"]:
            if isinstance(choice, dict):
                changed |= _without_logprobs(choice) | self._choice(choice)
        if doc["choices"]:
            self._template = doc
        if not changed:
            return event
        others = [ln for ln in lines if not ln.startswith(b"data:")]
        return b"\n".join([*others, b"data: " + orjson.dumps(doc)]) + b"\n\n"

    def _choice(self, choice: dict[str, Any]) -> bool:
        slots = _text_slots(choice)
        if slots is None:
            return False
        holder, names = slots
        index = choice.get("index", 0)
        index = index if isinstance(index, int) else 0
        finishing = choice.get("finish_reason") is not None
        changed = False
        for name in names:
            original = holder.get(name)
            if not isinstance(original, str) and not (finishing and (index, name) in self._streams):
                continue
            stream = self._streams.setdefault((index, name), TextStream(self.kinds, self.counts))
            text = stream.feed(original) if isinstance(original, str) else ""
            if finishing:
                text += stream.flush()
            if text == original or (original is None and not text):
                continue
            holder[name] = text
            changed = True
        return changed

    def _closing(self) -> bytes:
        """An event with what every choice still holds back (before [DONE] or at the end)."""
        held: dict[int, dict[str, str]] = {}
        for (index, name), s in sorted(self._streams.items()):
            if s.pending:
                held.setdefault(index, {})[name] = s.flush()
        if not held or self._template is None:
            return b""
        doc = dict(self._template)
        chat = "delta" in (self._template["choices"][0] if self._template["choices"] else {})
        choices = []
        for index, texts in sorted(held.items()):
            piece: dict[str, Any] = {"index": index, "finish_reason": None}
            piece.update({"delta": texts} if chat else texts)
            choices.append(piece)
        doc["choices"] = choices
        doc.pop("usage", None)
        return b"data: " + orjson.dumps(doc) + b"\n\n"

