"""The stream loop over real gRPC, in process: what Envoy would receive for each message."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.app import build_pipeline
from extproc.cache.keeper import PUT_TASK
from extproc.config import Config
from extproc.metrics import Metrics
from extproc.port import ListenError
from extproc.server import mark_draining, mark_serving, start_server
from extproc.wire import Mode


def headers(values: dict[str, str], end: bool = False) -> pb.ProcessingRequest:
    hv = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hv), end_of_stream=end)
    )


def body(data: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=True))


def response_headers(status: int) -> pb.ProcessingRequest:
    return response_headers_of({":status": str(status)})


def response_headers_of(values: dict[str, str]) -> pb.ProcessingRequest:
    hv = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hv)))


POST = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
GOOD = orjson.dumps({"model": "phi-3", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
async def stub() -> AsyncIterator[pb_grpc.ExternalProcessorStub]:
    metrics = Metrics()
    pipeline = build_pipeline(Config(), metrics)
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, 2 << 20)
    server, port, health = running.server, running.port, running.health
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = health_pb2_grpc.HealthStub(channel)
        status = await check.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await mark_serving(health)
        status = await check.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        yield pb_grpc.ExternalProcessorStub(channel)
    await server.stop(0)
    await running.processor.pipeline.aclose()


async def exchange(
    stub: pb_grpc.ExternalProcessorStub, *messages: pb.ProcessingRequest
) -> list[pb.ProcessingResponse]:
    call = stub.Process()
    out = []
    for message in messages:
        await call.write(message)
        out.append(await call.read())
    await call.done_writing()
    return out


def set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


async def test_valid_request_is_routed_rewritten_and_tagged(stub: pb_grpc.ExternalProcessorStub) -> None:
    first, second, third = await exchange(
        stub, headers({**POST, "x-gate-cluster": "primary"}), body(GOOD), response_headers(200)
    )
    common = first.request_headers.response
    assert list(common.header_mutation.remove_headers) == ["x-gate-cluster"]
    assert common.clear_route_cache
    common = second.request_body.response
    assert common.clear_route_cache
    sent = set_headers(common.header_mutation)
    rewritten = common.body_mutation.body
    assert sent["x-gate-cluster"] == "fallback"
    assert orjson.loads(rewritten)["model"] == "phi-3-mini"
    assert sent["content-length"] == str(len(rewritten))
    back = set_headers(third.response_headers.response.header_mutation)
    assert back["x-gate-cluster"] == "fallback"
    assert len(back["x-gate-request-id"]) == 32


async def test_bad_json_is_an_immediate_openai_error(stub: pb_grpc.ExternalProcessorStub) -> None:
    _, reply = await exchange(stub, headers(POST), body(b"{nope"))
    immediate = reply.immediate_response
    assert immediate.status.code == 400
    assert set_headers(immediate.headers)["content-type"] == "application/json"
    assert orjson.loads(immediate.body)["error"]["type"] == "invalid_request_error"


async def test_headers_only_post_gets_400_at_once(stub: pb_grpc.ExternalProcessorStub) -> None:
    (reply,) = await exchange(stub, headers(POST, end=True))
    assert reply.immediate_response.status.code == 400
    assert b"empty" in reply.immediate_response.body


async def test_unhandled_path_passes_through_with_mode_override(stub: pb_grpc.ExternalProcessorStub) -> None:
    (reply,) = await exchange(stub, headers({":method": "GET", ":path": "/v1/models", "x-gate-x": "1"}))
    assert reply.HasField("mode_override")
    mode = reply.mode_override
    assert (mode.request_body_mode, mode.response_header_mode) == (Mode.NONE, Mode.SKIP)
    assert list(reply.request_headers.response.header_mutation.remove_headers) == ["x-gate-x"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("GET", "/metrics"),
        ("POST", "/v1/models"),
        ("POST", "//v1/chat/completions"),
    ],
)
async def test_a_path_neither_handled_nor_allowed_is_refused_404(
    stub: pb_grpc.ExternalProcessorStub, method: str, path: str
) -> None:
    """Behind an Envoy whose own routes would let it through, the gate still refuses it."""
    (reply,) = await exchange(stub, headers({":method": method, ":path": path}))
    assert reply.immediate_response.status.code == 404
    error = orjson.loads(reply.immediate_response.body)["error"]
    assert error["code"] == "not_found" and "POST /v1/chat/completions" in error["message"]


async def test_envoys_own_reply_to_a_request_no_filter_saw_passes_untouched(
    stub: pb_grpc.ExternalProcessorStub,
) -> None:
    """E.g. the redirect of a path with an escaped slash: response headers with no request."""
    (reply,) = await exchange(stub, response_headers(307))
    assert reply.HasField("response_headers")
    assert not reply.response_headers.response.header_mutation.set_headers


async def test_body_before_headers_is_a_protocol_error(stub: pb_grpc.ExternalProcessorStub) -> None:
    call = stub.Process()
    await call.write(body(GOOD))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_with_every_optional_stage_off_a_pools_5xx_still_says_do_not_retry() -> None:
    """Stages that cannot act under the config are never called (nor timed), but the breaker's
    advice on a model's 5xx holds with the breaker off."""
    off = {"enabled": False}
    config = Config.model_validate(
        {"ratelimit": off, "breaker": off, "cache": off, "admission": off, "sanitize": {"mode": "off"}}
    )
    metrics = Metrics()
    pipeline = build_pipeline(config, metrics)
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, 2 << 20)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            *_, answer = await exchange(stub, headers(POST), body(GOOD), response_headers(503))
            again = await exchange(stub, headers(POST), body(GOOD), response_headers(200))
    finally:
        await running.server.stop(0)
        await running.processor.pipeline.aclose()
    back = set_headers(answer.response_headers.response.header_mutation)
    assert back["x-should-retry"] == "false"
    assert not answer.HasField("mode_override")  # nothing waits for the body: Envoy keeps it
    assert back["x-gate-request-id"] != set_headers(again[2].response_headers.response.header_mutation)[
        "x-gate-request-id"
    ]
    samples = metrics.stage_seconds.collect()[0].samples
    timed = {s.labels["stage"] for s in samples if s.name.endswith("_count")}
    assert timed == {"identity", "validate", "route", "prompt_limit"}


async def test_an_answer_the_guardrail_cannot_read_is_withheld() -> None:
    """A listed tenant's answer that came compressed (the gate asked for plain bytes) cannot be
    checked for personal data: the client gets a JSON 500 instead of it."""
    config = Config.model_validate({"guardrail": {"tenants": ["anonymous"]}, "cache": {"enabled": False}})
    pipeline = build_pipeline(config, Metrics())
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, 2 << 20)

    def answer_headers(**extra: str) -> pb.ProcessingRequest:
        return response_headers_of({":status": "200", "content-type": "application/json", **extra})

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            gzip = answer_headers(**{"content-encoding": "gzip"})
            *_, answer = await exchange(stub, headers(POST), body(GOOD), gzip)
            *_, plain = await exchange(stub, headers(POST), body(GOOD), answer_headers())
    finally:
        await running.server.stop(0)
        await running.processor.pipeline.aclose()
    immediate = answer.immediate_response
    error = orjson.loads(immediate.body)["error"]
    assert immediate.status.code == 500 and error["code"] == "gate_error"
    assert "'guardrail'" in error["message"] and "withheld" in error["message"]
    assert set_headers(immediate.headers)["x-request-id"] in error["message"]
    assert plain.HasField("response_headers")  # a plain answer goes on (with its filter)


async def test_a_miss_is_written_to_envoy_before_the_embedded_store_keeps_it() -> None:
    """The embedded store's call is only CPU: it runs once the answer's last message is on
    the wire, not in front of it. The next request then finds the entry."""
    pipeline = build_pipeline(Config(), Metrics())
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, 2 << 20)
    assert pipeline.services is not None
    store, events = pipeline.services.answers, []
    put = store.put

    async def noted_put(item: Any) -> None:
        events.append(b"put")
        await put(item)

    store.put = noted_put  # type: ignore[method-assign]
    answer = (
        b'{"id":"x","object":"chat.completion","model":"phi-3","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}'
    )
    json_headers = {":status": "200", "content-type": "application/json"}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            await exchange(stub, headers({**POST, "x-warm": "1"}))  # the connection is up
            for connection in running.server.connections:
                write = connection.transport.write

                def noted_write(data: Any, write: Any = write) -> None:
                    events.append(bytes(data))
                    write(data)

                connection.transport.write = noted_write  # type: ignore[method-assign]
            last = pb.ProcessingRequest(response_body=pb.HttpBody(body=answer, end_of_stream=True))
            *_, sent = await exchange(
                stub, headers(POST), body(GOOD), response_headers_of(json_headers), last
            )
            await pipeline.services.tasks.wait(1.0, PUT_TASK)
            *_, repeat = await exchange(stub, headers(POST), body(GOOD))
    finally:
        await running.server.stop(0)
        await running.processor.pipeline.aclose()
    written = next(i for i, e in enumerate(events) if sent.SerializeToString() in e)
    assert events.index(b"put") > written
    hit = repeat.immediate_response
    assert set_headers(hit.headers)["x-gate-cache"] == "hit" and b'"content":"Hello."' in hit.body


# --- the port itself: what Envoy's connection and health checks rely on ---


async def test_one_connection_carries_more_streams_than_h2s_default_limit(
    stub: pb_grpc.ExternalProcessorStub,
) -> None:
    """Requests wait (admission, coalescing) with their streams open, all on Envoy's one
    connection per worker thread: 300 streams open at once are each answered."""
    calls = [stub.Process() for _ in range(300)]
    for call in calls:
        await call.write(headers(POST))
    answers = [await call.read() for call in calls]  # every stream still open
    assert all(a.HasField("request_headers") for a in answers)
    for call in calls:
        await call.done_writing()
        call.cancel()


async def test_health_watch_streams_each_change() -> None:
    pipeline = build_pipeline(Config(), Metrics())
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, 2 << 20)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            check = health_pb2_grpc.HealthStub(channel)
            service = "envoy.service.ext_proc.v3.ExternalProcessor"
            watch = check.Watch(health_pb2.HealthCheckRequest(service=service))
            first = await watch.read()
            await mark_serving(running.health)
            second = await watch.read()
            await mark_draining(running.health)
            third = await watch.read()
            watch.cancel()
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await check.Check(health_pb2.HealthCheckRequest(service="nope"))
    finally:
        await running.server.stop(0)
        await running.processor.pipeline.aclose()
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert [first.status, second.status, third.status] == [not_serving, serving, not_serving]
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_message_over_the_limit_is_refused_and_the_port_stays_up(
    stub: pb_grpc.ExternalProcessorStub,
) -> None:
    call = stub.Process()
    await call.write(headers(POST))
    await call.read()
    await call.write(body(b"x" * (3 << 20)))  # the stub fixture's server accepts 2 MiB
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _, reply = await exchange(stub, headers(POST), body(GOOD))
    assert reply.HasField("request_body")


async def test_a_port_in_use_is_a_listen_error() -> None:
    pipeline = build_pipeline(Config(), Metrics())
    await pipeline.start()
    running = await start_server(pipeline, "127.0.0.1", 0, 2 << 20)
    try:
        with pytest.raises(ListenError):
            await start_server(pipeline, "127.0.0.1", running.port, 2 << 20)
    finally:
        await running.server.stop(0)
        await running.processor.pipeline.aclose()


async def test_a_stream_envoy_resets_after_its_answer_logs_nothing(
    stub: pb_grpc.ExternalProcessorStub, caplog: pytest.LogCaptureFixture
) -> None:
    """Envoy ends every finished stream with a reset: a log line for each would be one per request."""
    caplog.set_level(logging.INFO)
    for _ in range(5):
        call = stub.Process()
        await call.write(headers(POST))
        await call.read()
        call.cancel()
    await exchange(stub, headers(POST), body(GOOD))  # the resets have been read by now
    noted = [r.getMessage() for r in caplog.records
             if r.name == "llm_gate.port" or r.levelno >= logging.WARNING]
    assert noted == []
