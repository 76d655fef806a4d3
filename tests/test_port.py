"""The gate's gRPC port on its own, with a gRPC client from another implementation (grpcio):
flow control both ways, errors as statuses, cancellation reaching the handler, the graceful stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest as Text
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, PingAckReceived, ResponseReceived, StreamEnded, TrailersReceived
from h2.settings import SettingCodes

from extproc import http2
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


@asynccontextmanager
async def serving(max_bytes: int = 1 << 20) -> AsyncIterator[int]:
    """A port with the test service; its port number."""
    service = Service()
    server = GateServer([service], lambda: 0, max_bytes, Tasks(Metrics()))
    sock = listen("127.0.0.1", 0)
    await server.start(sock)
    try:
        yield sock.getsockname()[1]
    finally:
        await server.stop(0)


class Client:
    """A plain HTTP/2 client (h2) on one connection; it sends no WINDOW_UPDATE unless told to
    (as Envoy, whose windows are large, need not)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = H2Connection(H2Configuration(client_side=True))
        self.h2.initiate_connection()

    @classmethod
    async def connect(cls, port: int) -> Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.flush()
        return client

    def request(
        self, sid: int, content_type: str = "application/grpc", extra: list[tuple[str, str]] | None = None,
        path: str = ECHO, **priority: Any,
    ) -> None:
        headers = [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "gate"),
                   ("content-type", content_type), *(extra or [])]
        self.h2.send_headers(sid, headers, **priority)

    def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())

    async def events(self, until: type, acknowledge: bool = False) -> list[Any]:
        """What the port sends, as h2's events, up to the first of type `until`."""
        got: list[Any] = []
        while not any(isinstance(e, until) for e in got):
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            assert data, f"the port closed the connection before a {until.__name__}: {got}"
            for event in self.h2.receive_data(data):
                got.append(event)
                if acknowledge and isinstance(event, DataReceived):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            self.flush()
        return got

    def body(self, sid: int, body: bytes) -> None:
        """`body` in 16 KB frames, the last ending the stream."""
        for i in range(0, len(body), 16384):
            self.h2.send_data(sid, body[i:i + 16384], end_stream=i + 16384 >= len(body))
        self.flush()

    async def exchange(self, content_type: str, body: bytes) -> tuple[bytes, bytes, dict[bytes, bytes]]:
        """One request on stream 1, its body in 16 KB frames: the answer."""
        self.request(1, content_type)
        self.body(1, body)
        answered = answer(await self.events(StreamEnded))
        self.writer.close()
        return answered


def answer(events: list[Any]) -> tuple[bytes, bytes, dict[bytes, bytes]]:
    """The status, body and trailers of a stream's answer."""
    status, body, trailers = b"", b"", {}
    for event in events:
        if isinstance(event, ResponseReceived):
            status = dict(event.headers)[b":status"]
        elif isinstance(event, DataReceived):
            body += event.data
        elif isinstance(event, TrailersReceived):
            trailers = dict(event.headers)
    return status, body, trailers


def grpc_framed(text: str) -> bytes:
    body: bytes = Text(service=text).SerializeToString()
    return b"\0" + len(body).to_bytes(4, "big") + body


async def h2_exchange(content_type: str, body: bytes) -> tuple[bytes, bytes, dict[bytes, bytes]]:
    async with serving() as port:
        return await (await Client.connect(port)).exchange(content_type, body)


async def test_not_grpc_gets_an_http_status() -> None:
    """A plain HTTP/2 request is refused with an HTTP status, not half-served."""
    status, _, _ = await h2_exchange("text/plain", b"hello")
    assert status == b"415"


async def test_a_message_larger_than_a_frame_goes_out_while_the_window_has_room() -> None:
    """40 KB is more than one 16 KB frame and less than the 64 KB window: the whole answer
    goes out without waiting for a WINDOW_UPDATE the client has no reason to send."""
    framed = grpc_framed("x" * 40_000)
    status, received, trailers = await h2_exchange("application/grpc", framed)
    assert status == b"200" and trailers[b"grpc-status"] == b"0"
    assert received == framed


async def test_padding_priorities_continuations_and_pings_are_read() -> None:
    """What a client may send that Envoy seldom does: a header block over one frame (so HEADERS
    + CONTINUATION), padded frames, a priority in HEADERS, a PING."""
    async with serving() as port:
        client = await Client.connect(port)
        client.request(1, extra=[("x-long", "v" * 40_000)])
        client.h2.send_data(1, grpc_framed("one"), end_stream=True, pad_length=30)
        client.request(3, priority_weight=200)
        client.h2.send_data(3, grpc_framed("three"), end_stream=True)
        client.h2.ping(b"12345678")
        client.flush()
        events = await client.events(StreamEnded)  # the PING's answer leaves first, or with it
        if sum(isinstance(e, StreamEnded) for e in events) < 2:
            events += await client.events(StreamEnded)
    assert any(isinstance(e, PingAckReceived) and e.ping_data == b"12345678" for e in events)
    for sid, text in ((1, "one"), (3, "three")):
        status, body, trailers = answer([e for e in events if getattr(e, "stream_id", None) == sid])
        assert (status, body, trailers[b"grpc-status"]) == (b"200", grpc_framed(text), b"0")


async def test_a_client_with_small_windows_gets_the_answer_as_it_opens_them() -> None:
    """A client whose stream window is 1 KB and who wants HPACK's table at 0 bytes: the 40 KB
    answer comes in pieces, each after a WINDOW_UPDATE, and its headers still decode."""
    async with serving() as port:
        client = await Client.connect(port)
        client.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1024, SettingCodes.HEADER_TABLE_SIZE: 0})
        client.request(1)
        client.body(1, grpc_framed("w" * 40_000))
        events = await client.events(StreamEnded, acknowledge=True)
    status, body, trailers = answer(events)
    assert status == b"200" and body == grpc_framed("w" * 40_000) and trailers[b"grpc-status"] == b"0"
    assert sum(isinstance(e, DataReceived) for e in events) >= 40


@pytest.mark.parametrize(
    ("sent", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n", 1),  # not HTTP/2 at all: PROTOCOL_ERROR
        (http2.frame(http2.DATA, 0, 1, b"x" * 20_000), 6),  # a frame over 16 KB: FRAME_SIZE_ERROR
        # past the 4 MB window, on a call that reads no more (so gives none of it back)
        (b"".join(http2.frame(http2.DATA, 0, 1, b"x" * 16_384) for _ in range(260)), 3),
        (http2.frame(http2.HEADERS, http2.END_HEADERS, 1, b"\xff\xff\xff\xff"), 9),  # bad HPACK
        (http2.frame(http2.CONTINUATION, http2.END_HEADERS, 1, b"\x82"), 1),  # no HEADERS before
    ],
    ids=["http1", "frame-size", "flow-control", "hpack", "continuation"],
)
async def test_a_client_that_breaks_http2_loses_its_connection_and_only_that(sent: bytes, code: int) -> None:
    """Told why in a GOAWAY, then closed; the port goes on serving other connections."""
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if not sent.startswith(b"GET"):  # a good start, then the fault
            client = Client(reader, writer)
            client.request(1, path=HOLD)
            client.h2.send_data(1, grpc_framed("hold"))
            client.flush()
        writer.write(sent)
        data = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            data += chunk
        goaway = data[data.rfind(bytes((0, 0, 8, http2.GOAWAY))):]
        assert int.from_bytes(goaway[13:17], "big") == code, data
        other = await Client.connect(port)
        status, body, _ = await other.exchange("application/grpc", grpc_framed("still"))
        assert (status, body) == (b"200", grpc_framed("still"))
