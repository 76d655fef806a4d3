"""Capture (SSE frames split anywhere must reassemble) and replay in the caller's framing."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.cache.entry import Capture, Entry
from extproc.cache.replay import replay


def sse(*docs: Any) -> bytes:
    return b"".join(
        b"data: " + (d.encode() if isinstance(d, str) else orjson.dumps(d)) + b"\n\n" for d in docs
    )


HEAD = {"id": "chatcmpl-old", "object": "chat.completion.chunk", "created": 1, "model": "llama-3-8b"}
STREAM = [
    {
        **HEAD,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Paris"}, "finish_reason": None}],
    },
    {**HEAD, "choices": [{"index": 0, "delta": {"content": " is it."}, "finish_reason": None}]},
    {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {**HEAD, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}},
    "[DONE]",
]
JSON = {
    "id": "chatcmpl-old",
    "object": "chat.completion",
    "created": 1,
    "model": "llama-3-8b",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris is it."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}


def captured(
    kind: str, pieces: list[bytes], max_bytes: int = 1 << 20
) -> tuple[str, tuple[tuple[float, str], ...]] | None:
    clock = itertools.count(0, 0.25).__next__
    cap = Capture(kind, max_bytes, clock)  # type: ignore[arg-type]
    for piece in pieces:
        cap.feed(piece)
    return cap.finish(allow_tool_calls=False)


def entry(kind: str, kept: tuple[str, tuple[tuple[float, str], ...]]) -> Entry:
    return Entry(kind, kept[0], kept[1], "q", "llama-3-8b", "acme", 0.0)  # type: ignore[arg-type]


@given(st.lists(st.integers(min_value=0, max_value=len(sse(*STREAM))), max_size=12))
def test_sse_frames_split_anywhere_reassemble(cuts: list[int]) -> None:
    raw = sse(*STREAM)
    bounds = [0, *sorted(cuts), len(raw)]
    kept = captured("sse", [raw[a:b] for a, b in itertools.pairwise(bounds)])
    assert kept is not None
    assert [orjson.loads(d) if d != "[DONE]" else d for _, d in kept[1]] == STREAM


def test_crlf_frames_and_relative_timings() -> None:
    kept = captured("sse", [sse(*STREAM[:2]).replace(b"\n", b"\r\n"), sse(*STREAM[2:])])
    assert kept is not None
    times = [t for t, _ in kept[1]]
    assert times[0] == 0.0 and times == sorted(times)


@pytest.mark.parametrize(
    ("case", "kind", "pieces"),
    [
        ("stream cut before the finish", "sse", [sse(*STREAM[:2])]),
        ("bad json body", "json", [b'{"choices": ']),
        ("an error event", "sse", [sse({"error": {"message": "overloaded"}}, "[DONE]")]),
        ("too large", "json", [orjson.dumps(JSON)] * 3),
    ],
)
def test_incomplete_or_bad_answers_are_not_kept(case: str, kind: str, pieces: list[bytes]) -> None:
    assert captured(kind, pieces, max_bytes=2 * len(orjson.dumps(JSON))) is None


def test_entry_round_trips() -> None:
    e = Entry("sse", "", ((0.0, "a"), (0.5, "[DONE]")), "q?", "m", "t", 12.5, source="s.k", similarity=0.93)
    assert Entry.load(e.dump()) == e


@pytest.mark.parametrize("stored", ["json", "sse"])
@pytest.mark.parametrize("stream", [False, True])
def test_replay_gives_the_same_answer_in_the_callers_framing(stored: str, stream: bool) -> None:
    pieces = [sse(*STREAM)] if stored == "sse" else [orjson.dumps(JSON)]
    kept = captured(stored, pieces)
    assert kept is not None
    ctype, body = replay(entry(stored, kept), stream, include_usage=True, rid="chatcmpl-new", created=99)
    if not stream:
        assert ctype == "application/json"
        doc = orjson.loads(body)
        assert (doc["id"], doc["created"], doc["object"]) == ("chatcmpl-new", 99, "chat.completion")
        assert doc["choices"][0]["message"] == {"role": "assistant", "content": "Paris is it."}
        assert doc["choices"][0]["finish_reason"] == "stop"
        assert doc["usage"]["total_tokens"] == 10
        return
    assert ctype == "text/event-stream"
    frames = [f.removeprefix(b"data: ") for f in body.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    chunks = [orjson.loads(f) for f in frames[:-1]]
    assert {(c["id"], c["created"], c["object"]) for c in chunks} == {
        ("chatcmpl-new", 99, "chat.completion.chunk")
    }
    text = "".join((ch.get("delta") or {}).get("content") or "" for c in chunks for ch in c["choices"])
    assert text == "Paris is it."
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["total_tokens"] == 10


def test_usage_frame_only_when_asked() -> None:
    kept = captured("sse", [sse(*STREAM)])
    assert kept is not None
    _, body = replay(entry("sse", kept), True, include_usage=False, rid="x", created=1)
    assert b'"usage":{' not in body


def test_completions_replay_both_ways() -> None:
    doc: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": "Hi there", "logprobs": None, "finish_reason": "length"}],
    }
    kept = captured("json", [orjson.dumps(doc)])
    assert kept is not None
    _, body = replay(entry("json", kept), True, False, "cmpl-2", 5)
    chunks = [orjson.loads(f[6:]) for f in body.split(b"\n\n") if f and f != b"data: [DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hi there"
    stream_kept = captured("sse", [body])
    assert stream_kept is not None
    _, back = replay(entry("sse", stream_kept), False, False, "cmpl-3", 6)
    assert orjson.loads(back)["choices"][0] == {**doc["choices"][0]}


def _no_usage(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "usage"}


STORED = {  # what the upstream sent: with its usage, or without (a stream not asked for it)
    "json with usage": ("json", [orjson.dumps(JSON)]),
    "json without usage": ("json", [orjson.dumps(_no_usage(JSON))]),
    "stream with usage": ("sse", [sse(*STREAM)]),
    "stream without usage": ("sse", [sse(*STREAM[:3], "[DONE]")]),
}


def _usage_of(body: bytes, stream: bool) -> tuple[list[Any], Any]:
    """(the usage field of every choice chunk, the usage the answer reports)."""
    if not stream:
        return [], orjson.loads(body).get("usage")
    frames = [f.removeprefix(b"data: ") for f in body.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    chunks = [orjson.loads(f) for f in frames[:-1]]
    with_choices = [c for c in chunks if c["choices"]]
    tail = [c for c in chunks if not c["choices"]]
    assert len(tail) <= 1 and chunks[: len(with_choices)] == with_choices  # the usage chunk comes last
    return [c.get("usage", "absent") for c in with_choices], tail[0]["usage"] if tail else None


@pytest.mark.parametrize("stored", list(STORED))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("include_usage", [False, True], ids=["", "include_usage"])
def test_every_framing_carries_usage_as_openai_does(stored: str, stream: bool, include_usage: bool) -> None:
    kind, pieces = STORED[stored]
    clock = itertools.count(0, 0.25).__next__
    capture = Capture(kind, 1 << 20, clock, prompt_tokens=7)  # type: ignore[arg-type]
    for piece in pieces:
        capture.feed(piece)
    kept = capture.finish(allow_tool_calls=False)
    assert kept is not None
    _, body = replay(entry(kind, kept), stream, include_usage, "chatcmpl-new", 99)
    per_chunk, usage = _usage_of(body, stream)
    if stream and not include_usage:
        assert usage is None and set(per_chunk) == {"absent"}
        return
    assert set(per_chunk) <= {None}  # a stream asking for usage: null on each chunk, then the usage
    assert usage is not None
    if stored.endswith("with usage"):
        assert usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        return
    # Counted by the gate's tokenizer ("Paris is it.": 4 word pieces), marked as an estimate.
    assert usage == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11, "estimated": True}


def test_a_stream_is_complete_at_done_before_its_end() -> None:
    capture = Capture("sse", 1 << 20)
    capture.feed(sse(*STREAM[:3]))
    assert not capture.complete
    capture.feed(sse("[DONE]"))
    assert capture.complete  # storable now: the end of the body may come after the client stopped reading
    assert capture.finish(allow_tool_calls=False) is not None
    assert not Capture("json", 1 << 20).complete
    too_large = Capture("sse", 64)
    too_large.feed(sse(*STREAM))
    assert not too_large.complete  # past max_bytes nothing is kept, [DONE] or not
