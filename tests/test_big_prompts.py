"""Big prompts: token counting and the exact key stay cheap and keep their answers, and small
requests keep being answered while a big one is counted."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import unicodedata
from collections.abc import AsyncIterator

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.app import build_pipeline, max_message_bytes
from extproc.cache.keys import CANON_MAX_CHARS, Question, exact_key, normalise
from extproc.config import parse_config
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.server import mark_serving, start_server
from extproc.stages.prompt_limit import PromptLimit
from extproc.tokens import PER_MESSAGE_OVERHEAD, TokenCounter, slices
from tests.test_server import POST, body, headers

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


# --- through the gate's gRPC server, in process: what Envoy would receive ---


@contextlib.asynccontextmanager
async def gate(section: str = "") -> AsyncIterator[pb_grpc.ExternalProcessorStub]:
    config = parse_config(section)
    pipeline = build_pipeline(config, Metrics())
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, max_message_bytes(config))
    await mark_serving(running.health)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield pb_grpc.ExternalProcessorStub(channel)
    finally:
        await running.server.stop(0)
        await running.processor.pipeline.aclose()


def chat_body(text: str) -> bytes:
    return orjson.dumps({"model": "phi-3", "messages": [{"role": "user", "content": text}]})


async def answer_to_body(stub: pb_grpc.ExternalProcessorStub, text: str) -> pb.ProcessingResponse:
    """The gate's answer to a request's body (headers first, as Envoy sends them)."""
    call = stub.Process()
    await call.write(headers(POST))
    await call.read()
    await call.write(body(chat_body(text)))
    reply: pb.ProcessingResponse = await call.read()
    while reply.HasField("override_message_timeout"):
        reply = await call.read()
    await call.done_writing()
    return reply


async def test_a_big_prompt_over_the_limit_gets_the_same_422_as_the_counter_gives() -> None:
    text = prose(512 * 1024)
    expected = TokenCounter().count([text], limit=16_384)  # the default limit; stops early
    async with gate() as stub:
        reply = await answer_to_body(stub, text)
    assert reply.immediate_response.status.code == 422
    error = orjson.loads(reply.immediate_response.body)["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"about {expected} tokens" in error["message"]


async def test_small_requests_are_answered_while_a_big_prompt_is_counted() -> None:
    big_text = prose(900 * 1024)  # ~280k tokens, counted in full: the pool takes 400k
    async with gate("validation: {max_prompt_tokens: 400000, max_body_bytes: 2097152}") as stub:
        big = asyncio.create_task(answer_to_body(stub, big_text))
        small = [await answer_to_body(stub, f"small question {i}") for i in range(10)]
        big_pending_after_the_small_ones = not big.done()
        big_reply = await big
    assert all(r.HasField("request_body") for r in small)  # each passed on to the model
    assert big_pending_after_the_small_ones
    assert big_reply.HasField("request_body")  # the big one too, once counted


async def test_the_prompt_limit_stage_counts_a_big_prompt_exactly_as_before() -> None:
    counter = TokenCounter()
    text = prose(200_000)
    stage = PromptLimit(parse_config("").routing, 400_000, counter)
    ex = Exchange("POST", "/v1/chat/completions", {})
    ex.payload = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                             {"role": "user", "content": text}]}
    ex.pool = "primary"
    try:
        assert await stage.on_request(ex) is None
    finally:
        counter.close()
    assert ex.prompt_tokens == counter.count(["be brief", text])
