"""Big prompts: token counting and the exact key stay cheap and keep their answers."""

from __future__ import annotations

import asyncio
import re
import time
import unicodedata

from extproc.cache.keys import CANON_MAX_CHARS, Question, exact_key, normalise
from extproc.tokens import PER_MESSAGE_OVERHEAD, TokenCounter, slices

WORDS = ["alpha", "beta,", "Gamma.", "delta?", "Ｆｕｌｌ", "café", "the\tquick\n\nbrown", "fox"]


def prose(chars: int) -> str:
    out, n, i = [], 0, 0
    while n < chars:
        w = WORDS[i % len(WORDS)] + str(i % 7)
        out.append(w)
        n += len(w) + 1
        i += 1
    return " ".join(out)


def test_slices_cut_at_whitespace_and_lose_nothing() -> None:
    text = prose(100_000)
    parts = list(slices(text, 4096))
    assert "".join(parts) == text
    assert all(p[-1].isspace() for p in parts[:-1])
    assert max(len(p) for p in parts) <= 4096


def test_count_in_slices_equals_the_whole_count() -> None:
    counter = TokenCounter(slice_chars=2048)
    text = prose(60_000)
    whole = len(counter._tok.encode(text, add_special_tokens=False).ids) + PER_MESSAGE_OVERHEAD
    assert counter.count([text]) == whole
    assert counter.count([text, "hello there"]) == whole + counter.count(["hello there"])


def test_count_with_a_limit_stops_early_and_still_reports_over_the_limit() -> None:
    counter = TokenCounter(slice_chars=2048)
    text = prose(300_000)
    full = counter.count([text])
    bounded = counter.count([text], limit=1000)
    assert bounded > 1000
    assert abs(bounded - full) / full < 0.1  # the "about N tokens" in the 422 stays about right
    # under the limit the answer is exact
    short = prose(3000)
    assert counter.count([short], limit=100_000) == counter.count([short])


def test_measure_of_a_big_prompt_leaves_the_event_loop_free() -> None:
    counter = TokenCounter(offload_chars=10_000)
    text = prose(400_000)

    async def main() -> tuple[int, int]:
        ticks: list[float] = []

        async def heartbeat() -> None:
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.01)
        before = len(ticks)
        n = await counter.measure([text])
        beat.cancel()
        return n, len(ticks) - before

    n, beats = asyncio.run(main())
    assert n == counter.count([text])
    assert beats > 3  # other coroutines ran while the prompt was counted


def reference_normalise(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def test_normalise_is_the_same_form_as_before() -> None:
    for text in ["  Hello\u3000WORLD \x1c\t", "Ｆｕｌｌ ｗｉｄｔｈ", "Straße  ", prose(5000), ""]:
        assert normalise(text) == reference_normalise(text)


def test_exact_key_of_a_huge_prompt_ignores_case_and_spacing_without_the_rich_form() -> None:
    calls: list[int] = []

    def canon(text: str) -> str:
        calls.append(len(text))
        return normalise(text)

    big = prose(CANON_MAX_CHARS * 4)
    a = exact_key(Question("s", big, "m", "t"), canon)
    b = exact_key(Question("s", "  " + big.upper().replace(" ", "  "), "m", "t"), canon)
    assert a == b
    assert calls == []
    exact_key(Question("s", "short one", "m", "t"), canon)
    assert calls == [9]
