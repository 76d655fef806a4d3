"""Cost of the safety screen's pure parts: `python -m load.bench_safety`.

The sanitizer on a clean and a dirty 1 KB prompt, and the guardrail's filter per streamed
SSE event (one token each) and on a 4 KB JSON answer, in English and in Chinese (fullwidth
punctuation and digits, read one for one as ASCII). Medians of many runs, microseconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import orjson

from extproc.safety.answer import AnswerFilter
from extproc.safety.sanitize import sanitize

PROSE = ("Hello, I ordered a pair of shoes last week and they have not arrived yet. "
         "Could you tell me where my parcel is and when it will be delivered? ") * 7
ZH = "您好，您的订单已经发货，预计三天内送达。如有问题，请随时联系客服，我们会尽快为您处理！" * 12


def timed(call: Callable[[], object], runs: int = 2000) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def stream_events(words: list[str]) -> list[bytes]:
    def event(word: str) -> bytes:
        choice = {"index": 0, "delta": {"content": word}, "finish_reason": None}
        return b"data: " + orjson.dumps({"id": "c", "choices": [choice]}) + b"\n\n"

    return [event(w) for w in words]


def main() -> None:
    dirty = PROSE[:300] + "\u200b\u202e" + PROSE[300:600] + "\U000e0041" * 20 + PROSE[600:]
    print(f"sanitize, clean {len(PROSE)} chars: {timed(lambda: sanitize(PROSE)):.1f} µs")
    print(f"sanitize, {len(dirty)} chars with 22 hidden: {timed(lambda: sanitize(dirty)):.1f} µs")
    words = [" " + w for w in (PROSE + " card 4111 1111 1111 1111 mail jane@corp.example.org").split()]
    zh = ZH + "卡号 ４１１１ １１１１ １１１１ １１１１"
    for lang, tokens, text in (("en", words, PROSE * 3 + " 4111 1111 1111 1111"),
                               ("zh", [zh[i : i + 2] for i in range(0, len(zh), 2)], ZH * 2 + zh)):
        events = stream_events(tokens)

        def run_stream(events: list[bytes] = events) -> None:
            f = AnswerFilter("sse")
            for e in events:
                f.feed(e, False)
            f.feed(b"data: [DONE]\n\n", True)

        per_event = timed(run_stream, 200) / (len(events) + 1)
        print(f"guardrail, {lang} streamed answer of {len(events)} events: {per_event:.1f} µs per event")
        answer = orjson.dumps({"choices": [{"message": {"content": text}}]})

        def run_json(answer: bytes = answer) -> None:
            AnswerFilter("json").feed(answer, True)

        print(f"guardrail, {lang} JSON answer of {len(answer)} bytes: {timed(run_json, 500):.1f} µs")


if __name__ == "__main__":
    main()
