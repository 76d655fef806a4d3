"""The gate as an OpenAI endpoint, driven by the official SDK (`openai.OpenAI` and
`openai.AsyncOpenAI`) through the real stack: Envoy, the gate, Redis, the simulators.

What an application sees: answers and cache hits in either framing parse as OpenAI's own and
carry `usage`; identical requests in flight share one model call; legacy completions work;
every rejection raises its SDK exception class with `param` and `code`; a 429 is retried
after `retry-after-ms`; a shed is a 503 with `eta_ms`; a failing pool's requests are served by
its fallback.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web

from load.stack import Stack, free_port

MODEL = "llama-3-8b"
KEY = "sk-test"
VIP = "sk-vip"  # waits up to 10 s for a slot (standard: 0.5 s)
LIMITED = "sk-limited"  # premium tenant "limited": one request at once, one every 2 s
Mode = str  # "sync" | "async"
MODES = ["sync", "async"]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    config = {
        "store": {"op_timeout_ms": 500},  # the shared cores are busy; 5 ms is the default
        "cache": {"semantic": {"enabled": False}},  # exact hits are enough here
        "identity": {
            "api_keys": {
                KEY: {"tenant": "acme"},
                VIP: {"tenant": "acme", "tier": "vip"},
                LIMITED: {"tenant": "limited", "tier": "premium"},
            },
            "unknown_keys": "reject",
        },
        "ratelimit": {"tiers": {"premium": {"tenant": {"rate": 0.5, "burst": 1}}}},
        "validation": {"max_prompt_tokens": 200},
        # One request at a time on the primary and a short wait for standard: a burst sheds.
        "admission": {
            "pools": {"primary": {"capacity": {"source": "static", "static_limit": 1}}},
            "deadline_ms": {"vip": 10_000, "premium": 10_000, "standard": 500},
        },
        "breaker": {
            "window_s": 4,
            "slices": 8,
            "min_samples": 4,
            "hold_s": 3,
            "recovery_s": 60,
            "probe_share": 0.01,
            "probe_interval_s": 30,
        },
    }
    with Stack(gate_config=config, with_redis=True, sim_args=["--itl-ms", "10"]) as s:
        yield s


def served(stack: Stack, pool: str = "primary") -> int:
    return int(httpx.get(stack.sim_url(pool) + "/admin/state").json()["served"])


def metric(stack: Stack, name: str, labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics").text
    return sum(
        float(m.group(1)) for m in re.finditer(rf"^{name}\{{[^}}]*{labels}[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    )


@dataclass
class Answer:
    headers: dict[str, str]
    body: Any  # a ChatCompletion / Completion, or the list of chunks of a stream


def sync_client(stack: Stack, key: str = KEY, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=retries, timeout=30)


def async_client(stack: Stack, key: str = KEY, retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=retries, timeout=30)


def ask(mode: Mode, stack: Stack, chat: bool = True, key: str = KEY, retries: int = 0, **kw: Any) -> Answer:
    """One SDK call in `mode`; a stream is read to its end."""
    if mode == "sync":
        with sync_client(stack, key, retries) as client:
            api: Any = client.chat.completions if chat else client.completions
            raw = api.with_raw_response.create(**kw)
            parsed = raw.parse()
            return Answer(dict(raw.headers), list(parsed) if kw.get("stream") else parsed)
    return asyncio.run(_ask_async(stack, chat, key, retries, **kw))


async def _ask_async(stack: Stack, chat: bool, key: str, retries: int, **kw: Any) -> Answer:
    async with async_client(stack, key, retries) as client:
        return await _create(client, chat, **kw)


async def _create(client: openai.AsyncOpenAI, chat: bool, **kw: Any) -> Answer:
    api: Any = client.chat.completions if chat else client.completions
    raw = await api.with_raw_response.create(**kw)
    parsed = raw.parse()
    return Answer(dict(raw.headers), [c async for c in parsed] if kw.get("stream") else parsed)


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def text_of(answer: Answer, chat: bool = True) -> str:
    if isinstance(answer.body, list):
        if chat:
            return "".join(c.choices[0].delta.content or "" for c in answer.body if c.choices)
        return "".join(c.choices[0].text for c in answer.body if c.choices)
    return str(answer.body.choices[0].message.content if chat else answer.body.choices[0].text)


def stored_by_reading_to_the_end(stack: Stack, chat: bool, **kw: Any) -> None:
    """A streamed original, read to the end of the body (see the last test for why)."""
    with sync_client(stack) as client:
        api: Any = client.chat.completions if chat else client.completions
        with api.with_streaming_response.create(**kw) as response:
            assert response.headers["x-gate-cache"] == "miss"
            lines = list(response.iter_lines())  # every line: stopping at [DONE] would close early
            assert "data: [DONE]" in lines


# ---------------------------------------------------------------- answers, hits and usage

ORIGINALS = ["json", "stream", "stream+usage"]
REPLAYS = ["json", "stream", "stream+usage"]


def framing(name: str) -> dict[str, Any]:
    if name == "json":
        return {}
    if name == "stream":
        return {"stream": True}
    return {"stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("original", ORIGINALS)
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_hits_in_every_framing_carry_usage_as_openai_does(
    stack: Stack, mode: Mode, original: str, chat: bool
) -> None:
    prompt = f"usage check {mode} {original} {'chat' if chat else 'legacy'}: name three rivers"
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 12}
    body |= {"messages": messages(prompt)} if chat else {"prompt": prompt}
    if original == "json":
        first = ask(mode, stack, chat, **body)
        assert first.headers["x-gate-cache"] == "miss"
        assert first.body.usage is not None and first.body.usage.total_tokens > 0
        expected = text_of(first, chat)
    else:
        stored_by_reading_to_the_end(stack, chat, **body, **framing(original))
        expected = None
    calls = served(stack)
    for replay in REPLAYS:
        hit = ask(mode, stack, chat, **body, **framing(replay))
        assert hit.headers["x-gate-cache"] == "hit", (original, replay)
        expected = expected or text_of(hit, chat)
        assert text_of(hit, chat) == expected
        if replay == "json":
            usage = hit.body.usage
            assert usage is not None and usage.completion_tokens > 0
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            # Counted by the gate when the stored stream had none, and said so.
            assert (usage.model_extra or {}).get("estimated") is (True if original == "stream" else None)
            continue
        chunks = hit.body
        assert chunks and all(c.id == chunks[0].id for c in chunks)
        if replay == "stream":
            assert all(c.usage is None for c in chunks)
            continue
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens > 0
        assert all(c.usage is None for c in chunks[:-1])
    assert served(stack) == calls  # every replay came from the cache


@pytest.mark.parametrize("mode", MODES)
def test_identical_requests_in_flight_share_one_model_call(stack: Stack, mode: Mode) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": messages(f"coalesce {mode}: a long story"),  # ~0.4 s of tokens
        "max_tokens": 40,
        "extra_body": {"ignore_eos": True},
    }
    calls = served(stack)

    async def burst() -> list[Answer]:
        async with async_client(stack, VIP) as client:
            framings = ["json", "stream+usage", "json", "stream"]
            return list(
                await asyncio.gather(*(_create(client, True, **body, **framing(f)) for f in framings))
            )

    if mode == "async":
        answers = asyncio.run(burst())
    else:
        # JSON only: the sync SDK closes a stream at [DONE], which the last test shows may keep
        # a streamed leader's answer out of the cache (the async SDK reads to the end).
        with sync_client(stack, VIP) as client:

            def one(extra: dict[str, Any]) -> Answer:
                raw = client.chat.completions.with_raw_response.create(**body, **extra)
                parsed = raw.parse()
                return Answer(dict(raw.headers), list(parsed) if extra.get("stream") else parsed)

            results: list[Answer] = []
            threads = [
                threading.Thread(target=lambda f=f: results.append(one(framing(f)))) for f in ["json"] * 4
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            answers = results
    assert len(answers) == 4
    assert sorted(a.headers["x-gate-cache"] for a in answers) == ["coalesced"] * 3 + ["miss"]
    assert len({text_of(a) for a in answers}) == 1
    assert served(stack) == calls + 1
    for a in answers:
        if not isinstance(a.body, list):
            assert a.body.usage is not None and a.body.usage.total_tokens > 0
            assert a.body._request_id == a.headers["x-request-id"] != ""  # response._request_id


# ---------------------------------------------------------------- rejections


def rejection(mode: Mode, stack: Stack, key: str = KEY, **kw: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        ask(mode, stack, True, key, **{"model": MODEL, "messages": messages("hello"), **kw})
    assert caught.value.request_id  # the SDK's error.request_id: the gate's x-request-id
    return caught.value


@pytest.mark.parametrize("mode", MODES)
def test_each_rejection_raises_its_exception_class_with_param_and_code(stack: Stack, mode: Mode) -> None:
    e = rejection(mode, stack, key="sk-unknown")
    assert isinstance(e, openai.AuthenticationError) and e.code == "invalid_api_key"
    e = rejection(mode, stack, temperature=5)
    assert isinstance(e, openai.BadRequestError) and e.param == "temperature"
    e = rejection(mode, stack, model="no-such-model")
    assert isinstance(e, openai.NotFoundError) and e.param == "model"
    e = rejection(mode, stack, messages=messages("word " * 400))
    assert isinstance(e, openai.UnprocessableEntityError)
    assert (e.param, e.code) == ("messages", "context_length_exceeded")
    e = rejection(mode, stack, messages=messages("x" * 1_100_000))
    assert e.status_code == 413 and e.code == "request_too_large"
    assert e.type == "invalid_request_error"


@pytest.mark.parametrize("mode", MODES)
def test_rate_limited_calls_are_retried_after_retry_after_ms(stack: Stack, mode: Mode) -> None:
    limited = 'decision="ratelimited"'
    before = metric(stack, "gate_requests_total", limited)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
    ask(mode, stack, key=LIMITED, retries=2, messages=messages(f"first {mode}"), **body)
    # The bucket is empty: without retries the SDK raises, with its default retries it waits and succeeds.
    e = rejection(mode, stack, key=LIMITED, messages=messages(f"second {mode}"))
    assert isinstance(e, openai.RateLimitError) and e.code == "rate_limit_exceeded"
    assert 0 < int(e.response.headers["retry-after-ms"]) <= 2000
    answer = ask(mode, stack, key=LIMITED, retries=2, messages=messages(f"third {mode}"), **body)
    assert text_of(answer)
    assert metric(stack, "gate_requests_total", limited) >= before + 2  # the raised one and the retried one


@pytest.mark.parametrize("mode", MODES)
def test_a_shed_is_a_503_with_eta_ms(stack: Stack, mode: Mode) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 60, "extra_body": {"ignore_eos": True}}

    async def burst() -> list[Answer | BaseException]:
        async with async_client(stack) as client:
            calls = [_create(client, True, messages=messages(f"shed {mode} {i}"), **body) for i in range(4)]
            return list(await asyncio.gather(*calls, return_exceptions=True))

    if mode == "async":
        outcomes = asyncio.run(burst())
    else:
        outcomes = []

        def one(i: int) -> None:
            try:
                outcomes.append(ask("sync", stack, messages=messages(f"shed {mode} {i}"), **body))
            except openai.APIStatusError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    sheds = [o for o in outcomes if isinstance(o, openai.APIStatusError)]
    assert sheds and all(isinstance(o, (Answer, openai.InternalServerError)) for o in outcomes)
    for e in sheds:
        assert e.status_code == 503 and (e.type, e.code) == ("overloaded", "overloaded")
        assert isinstance(e.body, dict) and isinstance(e.body["eta_ms"], int) and e.body["eta_ms"] > 0
        assert int(e.response.headers["retry-after"]) >= 1
    assert any(isinstance(o, Answer) for o in outcomes)


# ---------------------------------------------------- the fallback pool (changes the breaker: last)


def past_the_failing_primary(mode: Mode, stack: Stack, **kw: Any) -> Answer:
    """The first answer: the primary answers 500 until its breaker opens (and to any probe)."""
    deadline = time.monotonic() + 20  # the breaker holds a state at least hold_s (3 s)
    while time.monotonic() < deadline:
        try:
            return ask(mode, stack, model=MODEL, max_tokens=6, **kw)
        except openai.InternalServerError:
            time.sleep(0.1)
    raise AssertionError("the breaker never sent traffic to the fallback")


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_pool_is_answered_by_its_fallback(stack: Stack, mode: Mode) -> None:
    faults = stack.sim_url("primary") + "/admin/faults"
    httpx.post(faults, json={"error_rate": 1.0, "error_status": 500}).raise_for_status()
    try:
        answer = past_the_failing_primary(mode, stack, messages=messages(f"fallback {mode}"))
        assert answer.headers["x-gate-cluster"] == "fallback"
        assert answer.body.model == "phi-3-mini" and text_of(answer)
        assert answer.body.usage is not None and answer.body.usage.total_tokens > 0
        streamed = past_the_failing_primary(
            mode, stack, messages=messages(f"fallback stream {mode}"), **framing("stream+usage")
        )
        assert streamed.headers["x-gate-cluster"] == "fallback"
        assert {c.model for c in streamed.body} == {"phi-3-mini"} and streamed.body[-1].usage is not None
    finally:
        httpx.post(faults, json={"error_rate": 0.0}).raise_for_status()


# ---------------------------------------------------------------- a streamed answer is a hit once it ends


class SlowTail:
    """An upstream that sends a stream's `[DONE]` at once and ends the body a second later, as a
    model server may (the final chunk of the body travels apart from the last event)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.calls = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        ready.set()
        self.loop.run_forever()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        payload = await request.json()
        if not payload.get("stream"):
            message = {"role": "assistant", "content": "Rivers: Nile, Amazon, Danube."}
            return web.json_response(
                {
                    "id": f"chatcmpl-{self.calls}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
                }
            )
        head = {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": MODEL,
        }
        words = ["Rivers:", " Nile,", " Amazon,", " Danube."]
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i, word in enumerate(words):
            delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
            chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        last = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await resp.write(b"data: " + orjson.dumps(last) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(1.0)
        await resp.write_eof()
        return resp


class TailStack(Stack):
    """The stack with the primary pool served by a SlowTail in this process."""

    def _start_sims(self) -> None:
        primary = self.pool_ports.pop("primary")
        super()._start_sims()
        self.pool_ports["primary"] = primary


def test_a_streamed_answer_is_a_hit_right_after_its_stream_ends() -> None:
    upstream = SlowTail()
    config = {
        "cache": {"semantic": {"enabled": False}},
        "ratelimit": {"enabled": False},
        "store": {"op_timeout_ms": 500},
        "breaker": {"enabled": False},
    }
    with TailStack(
        gate_config=config,
        with_redis=True,
        pool_models={"fallback": ["phi-3-mini"]},
        pool_ports={"primary": upstream.port},
    ) as stack:
        body: dict[str, Any] = {"model": MODEL, "messages": messages("name three rivers"), "max_tokens": 8}
        with sync_client(stack) as client:
            stream = client.chat.completions.create(**body, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            started = time.monotonic()
            raw = client.chat.completions.with_raw_response.create(**body)
        assert raw.headers["x-gate-cache"] == "hit", f"after {time.monotonic() - started:.2f}s"
        assert upstream.calls == 1
