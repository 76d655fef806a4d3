from __future__ import annotations

from typing import Any

import orjson
import pytest

from extproc.safety.answer import AnswerFilter

CARD = "4111 1111 1111 1111"
TEXT = f"Your card {CARD} is on file."
REDACTED = "Your card [redacted:card] is on file."


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def stream(pieces: list[str]) -> bytes:
    body = event({"role": "assistant", "content": ""})
    body += b"".join(event({"content": p}) for p in pieces)
    return body + event({}, "stop") + b"data: [DONE]\n\n"


def run(filter_: AnswerFilter, chunks: list[bytes]) -> bytes:
    out = b"".join(filter_.feed(c, False) for c in chunks)
    return out + filter_.feed(b"", True)


def client_text(body: bytes) -> str:
    """What an SSE client shows: every delta's content, in order; [DONE] last."""
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    text = ""
    for e in events[:-1]:
        assert e.startswith(b"data: ")
        for choice in orjson.loads(e[6:])["choices"]:
            text += choice["delta"].get("content") or ""
    return text


def test_card_split_between_two_frames_at_every_position_and_every_byte() -> None:
    """The card's text split into two events at each character, and the bytes of that
    stream split into two chunks at each byte: the client always reads it redacted."""
    for at in range(len(TEXT) + 1):
        body = stream([TEXT[:at], TEXT[at:]])
        for cut in range(len(body) + 1):
            f = AnswerFilter("sse")
            out = run(f, [body[:cut], body[cut:]])
            assert client_text(out) == REDACTED, (at, cut)
            assert b"4111" not in out and b"1111" not in out
            assert dict(f.counts) == {"card": 1}


def test_fullwidth_card_split_between_two_frames_at_every_position() -> None:
    """As a Chinese answer writes it: fullwidth digits, three bytes each in UTF-8."""
    text = "您的卡号 ４１１１ １１１１ １１１１ １１１１ 已保存。"
    for at in range(len(text) + 1):
        body = stream([text[:at], text[at:]])
        for cut in range(len(body) + 1):
            out = run(AnswerFilter("sse"), [body[:cut], body[cut:]])
            assert client_text(out) == "您的卡号 [redacted:card] 已保存。", (at, cut)


def test_token_by_token_stream_holds_back_only_the_number() -> None:
    words = ["Your", " card", " 4111", " 1111", " 1111", " 1111", " is", " on", " file."]
    f = AnswerFilter("sse")
    seen = [client_text(f.feed(event({"content": w}), False) + b"data: [DONE]\n\n") for w in words]
    # Text goes out as soon as no match can still use it: a word waits for the next one only.
    assert seen[:3] == ["", "Your ", "card "]
    assert seen[3:6] == ["", "", ""]  # the digits wait: they may be a card
    assert "".join(seen) + client_text(f.feed(b"data: [DONE]\n\n", True)) == REDACTED


@pytest.mark.parametrize("split", [1, 7, 19])
def test_completions_stream_and_multiple_choices(split: int) -> None:
    def ev(index: int, text: str, finish: str | None = None) -> bytes:
        doc = {"id": "c", "object": "text_completion",
               "choices": [{"index": index, "text": text, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    mail = "write to jane@corp.example.org today"
    body = (ev(0, mail[:split]) + ev(1, "call 13800138000") + ev(0, mail[split:]) + ev(1, "", "stop")
            + ev(0, "", "length") + b"data: [DONE]\n\n")
    f = AnswerFilter("sse")
    out = run(f, [body])
    texts: dict[int, str] = {0: "", 1: ""}
    for e in out.split(b"\n\n"):
        if e.startswith(b"data: {"):
            for c in orjson.loads(e[6:])["choices"]:
                texts[c["index"]] += c["text"]
    assert texts == {0: "write to [redacted:email] today", 1: "call [redacted:phone]"}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_streamed_reasoning_is_redacted_apart_from_the_answer(field: str) -> None:
    """A reasoning model streams its thinking in its own delta field, then the answer."""
    thought = f"The user's card is {CARD}, I should not repeat it."
    body = event({"role": "assistant", "content": ""})
    body += b"".join(event({field: thought[i : i + 3]}) for i in range(0, len(thought), 3))
    body += b"".join(event({"content": w}) for w in ("Your card ", CARD[:9], CARD[9:], " is on file."))
    body += event({}, "stop") + b"data: [DONE]\n\n"
    for cut in range(0, len(body) + 1, 5):
        f = AnswerFilter("sse")
        out = run(f, [body[:cut], body[cut:]])
        reasoning = content = ""
        for e in out.split(b"\n\n"):
            if e.startswith(b"data: {"):
                delta = orjson.loads(e[6:])["choices"][0]["delta"]
                reasoning += delta.get(field) or ""
                content += delta.get("content") or ""
        assert reasoning == "The user's card is [redacted:card], I should not repeat it.", cut
        assert content == REDACTED, cut
        assert b"4111" not in out and dict(f.counts) == {"card": 2}


def test_stream_cut_before_the_end_still_flushes_redacted() -> None:
    f = AnswerFilter("sse")
    out = run(f, [event({"content": "card 4111 1111 1111 1111"})])
    assert b"4111" not in out and b"[redacted:card]" in out


def test_json_answer_redacted_and_untouched_without_a_match() -> None:
    doc = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}}]}
    body = orjson.dumps(doc)
    f = AnswerFilter("json")
    out = run(f, [body[:10], body[10:]])
    assert orjson.loads(out)["choices"][0]["message"]["content"] == REDACTED
    clean = orjson.dumps({"choices": [{"message": {"content": "no secrets"}}]})
    assert run(AnswerFilter("json"), [clean]) == clean
    thinking = orjson.dumps({"choices": [{"message": {"reasoning": TEXT, "content": "Done."}}]})
    message = orjson.loads(run(AnswerFilter("json"), [thinking]))["choices"][0]["message"]
    assert message["reasoning"] == REDACTED


def test_log_probabilities_which_spell_the_answer_out_are_dropped() -> None:
    tokens = {"content": [{"token": t, "logprob": -0.1, "top_logprobs": []} for t in ("411", "1")]}
    doc = {"choices": [{"index": 0, "message": {"content": TEXT}, "logprobs": tokens}]}
    choice = orjson.loads(run(AnswerFilter("json"), [orjson.dumps(doc)]))["choices"][0]
    assert choice["logprobs"] is None and choice["message"]["content"] == REDACTED
    piece = {"id": "c", "choices": [{"index": 0, "delta": {"content": CARD}, "logprobs": tokens,
                                     "finish_reason": None}]}
    out = run(AnswerFilter("sse"), [b"data: " + orjson.dumps(piece) + b"\n\n", b"data: [DONE]\n\n"])
    assert b"411" not in out and b'"logprobs":null' in out


def test_usage_and_role_events_pass_unchanged() -> None:
    role = event({"role": "assistant"})
    usage = b'data: {"id":"c1","choices":[],"usage":{"total_tokens":3}}\n\n'
    f = AnswerFilter("sse")
    assert f.feed(role, False) == role
    assert f.feed(usage, False) == usage
