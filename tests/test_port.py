"""The gate's gRPC port on its own, with a gRPC client from another implementation (grpcio):
flow control both ways, errors as statuses, cancellation reaching the handler, the graceful stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest as Text
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived, StreamEnded, TrailersReceived

from extproc.metrics import Metrics
from extproc.port import GateServer, GRPCError, Method, Status, Stream, listen
from extproc.tasks import Tasks

ECHO, FAIL, HOLD = "/test.Port/Echo", "/test.Port/Fail", "/test.Port/Hold"


class Service:
    """Echo every message; fail; or hold the call until it is cancelled or released."""

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0
        self.open = 0

    async def echo(self, stream: Stream[Text, Text]) -> None:
        async for message in stream:
            await stream.send_message(message)

    async def fail(self, stream: Stream[Text, Text]) -> None:
        message = await stream.recv_message()
        if message is not None and message.service == "status":
            raise GRPCError(Status.FAILED_PRECONDITION, "not now: ünïcode % kept")
        raise RuntimeError("a bug")

    async def hold(self, stream: Stream[Text, Text]) -> None:
        self.open += 1
        try:
            await stream.recv_message()
            self.held.set()
            await self.release.wait()
            await stream.send_message(Text(service="released"))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.open -= 1

    def __mapping__(self) -> dict[str, Method]:
        return {ECHO: Method(self.echo, Text), FAIL: Method(self.fail, Text), HOLD: Method(self.hold, Text)}


@pytest.fixture
async def port() -> AsyncIterator[tuple[Service, GateServer, grpc.aio.Channel]]:
    service = Service()
    server = GateServer([service], lambda: service.open, 16 << 20, Tasks(Metrics()))
    sock = listen("127.0.0.1", 0)
    await server.start(sock)
    options = [("grpc.max_receive_message_length", 32 << 20), ("grpc.max_send_message_length", 32 << 20)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sock.getsockname()[1]}", options=options) as channel:
        yield service, server, channel
    await server.stop(0)


def call(channel: grpc.aio.Channel, path: str) -> Any:
    return channel.stream_stream(path, request_serializer=Text.SerializeToString,
                                 response_deserializer=Text.FromString)()


async def test_messages_larger_than_both_flow_control_windows_pass_whole(
    port: tuple[Service, GateServer, grpc.aio.Channel],
) -> None:
    """6 MiB each way: more than the port's 4 MiB window and grpcio's own; both must wait
    for window updates, in order, and lose nothing."""
    _, _, channel = port
    stream = call(channel, ECHO)
    texts = ["a" * (6 << 20), "b", "c" * 70_000]
    for text in texts:
        await stream.write(Text(service=text))
        assert (await stream.read()).service == text
    await stream.done_writing()
    assert await stream.read() is grpc.aio.EOF
    assert await stream.code() == grpc.StatusCode.OK


async def test_many_streams_interleave_on_one_connection(
    port: tuple[Service, GateServer, grpc.aio.Channel],
) -> None:
    _, _, channel = port

    async def one(i: int) -> list[str]:
        stream = call(channel, ECHO)
        got = []
        for j in range(3):
            await stream.write(Text(service=f"{i}.{j}"))
            got.append((await stream.read()).service)
        await stream.done_writing()
        return got

    answers = await asyncio.gather(*(one(i) for i in range(200)))
    assert answers == [[f"{i}.{j}" for j in range(3)] for i in range(200)]


async def test_errors_are_statuses_with_readable_messages(
    port: tuple[Service, GateServer, grpc.aio.Channel], caplog: pytest.LogCaptureFixture
) -> None:
    _, _, channel = port
    refused = call(channel, FAIL)
    await refused.write(Text(service="status"))
    assert await refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await refused.details() == "not now: ünïcode % kept"

    broken = call(channel, FAIL)
    await broken.write(Text(service="bug"))
    assert await broken.code() == grpc.StatusCode.INTERNAL
    assert any("failed" in r.getMessage() and r.exc_info for r in caplog.records if r.name == "llm_gate.port")

    missing = call(channel, "/test.Port/Nothing")
    await missing.done_writing()
    assert await missing.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/test.Port/Nothing" in await missing.details()


async def test_a_message_over_the_limit_ends_only_its_call(
    port: tuple[Service, GateServer, grpc.aio.Channel],
) -> None:
    _, _, channel = port
    big = call(channel, ECHO)
    await big.write(Text(service="x" * (17 << 20)))
    assert await big.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than 16777216" in await big.details()
    small = call(channel, ECHO)
    await small.write(Text(service="still here"))
    assert (await small.read()).service == "still here"
    await small.done_writing()


async def held_call(service: Service, channel: grpc.aio.Channel) -> Any:
    """A HOLD call its handler has begun."""
    stream = call(channel, HOLD)
    await stream.write(Text(service="wait"))
    await asyncio.wait_for(service.held.wait(), 5)
    return stream


async def eventually(condition: Callable[[], bool]) -> bool:
    for _ in range(100):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


async def test_a_client_that_cancels_cancels_the_handler(
    port: tuple[Service, GateServer, grpc.aio.Channel],
) -> None:
    service, _, channel = port
    (await held_call(service, channel)).cancel()
    assert await eventually(lambda: service.cancelled == 1)
    assert service.open == 0


async def test_the_stop_lets_open_calls_finish_within_the_grace_then_ends_them(
    port: tuple[Service, GateServer, grpc.aio.Channel],
) -> None:
    service, server, channel = port
    finishing = await held_call(service, channel)
    stopping = asyncio.create_task(server.stop(5.0))
    await asyncio.sleep(0.2)
    assert not stopping.done()  # the open call holds the stop
    service.release.set()
    assert (await finishing.read()).service == "released"
    await asyncio.wait_for(stopping, 5)

    # A call still open when the grace runs out is ended.
    service2 = Service()
    server2 = GateServer([service2], lambda: service2.open, 1 << 20, Tasks(Metrics()))
    sock = listen("127.0.0.1", 0)
    await server2.start(sock)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sock.getsockname()[1]}") as channel2:
        stuck = await held_call(service2, channel2)
        await asyncio.wait_for(server2.stop(0.3), 5)
        assert await stuck.code() != grpc.StatusCode.OK
    assert await eventually(lambda: service2.cancelled == 1)


async def h2_exchange(content_type: str, body: bytes) -> tuple[bytes, bytes, dict[bytes, bytes]]:
    """One request from a plain HTTP/2 client that never sends WINDOW_UPDATE (as Envoy, whose
    windows are large, need not): the response's status, body and trailers."""
    service = Service()
    server = GateServer([service], lambda: 0, 1 << 20, Tasks(Metrics()))
    sock = listen("127.0.0.1", 0)
    await server.start(sock)
    status, received, trailers = b"", b"", {}
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        client = H2Connection(H2Configuration(client_side=True))
        client.initiate_connection()
        client.send_headers(1, [(":method", "POST"), (":path", ECHO), (":scheme", "http"),
                                (":authority", "gate"), ("content-type", content_type)])
        for i in range(0, len(body), 16384):
            client.send_data(1, body[i:i + 16384], end_stream=i + 16384 >= len(body))
        writer.write(client.data_to_send())
        ended = False
        while not ended:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "the port closed the connection instead of answering"
            for event in client.receive_data(data):
                if isinstance(event, ResponseReceived):
                    status = dict(event.headers)[b":status"]
                elif isinstance(event, DataReceived):
                    received += event.data
                elif isinstance(event, TrailersReceived):
                    trailers = dict(event.headers)
                ended = ended or isinstance(event, StreamEnded)
            writer.write(client.data_to_send())
        writer.close()
    finally:
        await server.stop(0)
    return status, received, trailers


async def test_not_grpc_gets_an_http_status() -> None:
    """A plain HTTP/2 request is refused with an HTTP status, not half-served."""
    status, _, _ = await h2_exchange("text/plain", b"hello")
    assert status == b"415"


async def test_a_message_larger_than_a_frame_goes_out_while_the_window_has_room() -> None:
    """40 KB is more than one 16 KB frame and less than the 64 KB window: the whole answer
    goes out without waiting for a WINDOW_UPDATE the client has no reason to send."""
    text = Text(service="x" * 40_000).SerializeToString()
    framed = b"\0" + len(text).to_bytes(4, "big") + text
    status, received, trailers = await h2_exchange("application/grpc", framed)
    assert status == b"200" and trailers[b"grpc-status"] == b"0"
    assert received == framed
