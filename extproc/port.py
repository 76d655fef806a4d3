"""The gate's gRPC port: HTTP/2 by h2's state machine, gRPC's framing on top, nothing else.

Envoy opens a stream per HTTP request and sends a few small messages on it; a general gRPC
server's machinery per stream (queues, events, wrappers, metadata) cost more CPU than the
gate's own stages (`load/results/bench_gate.md`). This server does only what the gate's two
services need: streams of protobuf messages each way, a status in the trailers, the message
size limit, flow control both ways, many streams on one connection, TLS, and a graceful stop.
Everything written in one turn of the event loop leaves in one system call: the answers of
several streams then reach Envoy in one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Generic, TypeVar, cast

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes

from .tasks import Tasks

log = logging.getLogger("llm_gate.port")

Request = TypeVar("Request")
Response = TypeVar("Response")


class ListenError(OSError):
    """The gate's port is taken: restarting will not help."""


class Status(IntEnum):
    """The gRPC status codes the gate answers with."""

    OK = 0
    UNKNOWN = 2
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13


class GRPCError(Exception):
    """Ends a call with this status and message in its trailers."""

    def __init__(self, status: Status, message: str = "") -> None:
        super().__init__(message)
        self.status, self.message = status, message


class StreamGoneError(Exception):
    """The client reset the stream, or the connection closed: nothing more can be sent."""


@dataclass(frozen=True)
class Method:
    call: Callable[[Stream[Any, Any]], Awaitable[None]]
    request: Any  # the protobuf message class of what the client sends


# Streams Envoy may keep open on one connection: requests wait in the admission queue or for
# a coalesced answer with their stream open (h2's own default is 100).
MAX_STREAMS = 65_536
WINDOW = 4 << 20  # what a client may send ahead, per stream and per connection
_H2 = H2Configuration(
    client_side=False, header_encoding=None, validate_inbound_headers=False,
    validate_outbound_headers=False, normalize_inbound_headers=False, normalize_outbound_headers=False,
)
_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Stream(Generic[Request, Response]):
    """One call: the client's messages (`recv_message`, or `async for`) and the answers
    (`send_message`). The handler's return ends the call with status OK."""

    def __init__(self, port: _Connection, stream_id: int, method: Method, max_bytes: int) -> None:
        self._port, self.id, self._type, self._max = port, stream_id, method.request, max_bytes
        self._data = bytearray()  # received, not yet read
        self._held = 0  # received bytes not yet given back to the client's flow-control window
        self._ended = False  # the client sent its last message
        self._arrived: asyncio.Future[None] | None = None  # a reader waiting for data
        self.gone = False
        self.headers_sent = False
        self.task: asyncio.Task[None] | None = None

    def __aiter__(self) -> Stream[Request, Response]:
        return self

    async def __anext__(self) -> Request:
        message = await self.recv_message()
        if message is None:
            raise StopAsyncIteration
        return message

    async def recv_message(self) -> Request | None:
        """The next message, or None once the client has sent its last."""
        while True:
            data = self._data
            if len(data) >= 5:
                if data[0]:
                    raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not accepted")
                size = int.from_bytes(data[1:5], "big")
                if size > self._max:
                    raise GRPCError(Status.RESOURCE_EXHAUSTED,
                                    f"message of {size} bytes, more than {self._max} accepted")
                if len(data) >= 5 + size:
                    message = self._type.FromString(bytes(data[5:5 + size]))
                    del data[:5 + size]
                    self._give_back()
                    return message  # type: ignore[no-any-return]
            if self.gone:
                raise StreamGoneError()
            if self._ended:
                if data:
                    raise GRPCError(Status.INTERNAL, "the stream ended inside a message")
                return None
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                await self._arrived
            finally:
                self._arrived = None

    async def send_message(self, message: Response) -> None:
        body = message.SerializeToString()  # type: ignore[attr-defined]
        await self._port.send(self, b"\0" + len(body).to_bytes(4, "big") + body)

    def received(self, data: bytes, flow: int) -> None:
        self._data += data
        self._held += flow
        self._give_back()
        self._wake()

    def ended(self) -> None:
        self._ended = True
        self._wake()

    def lost(self) -> None:
        self.gone = True
        self._wake()

    def _give_back(self) -> None:
        """The client may send more once what it sent is read; while less than one whole
        message is waiting here, at once (a message larger than the window must get in)."""
        if self._held and len(self._data) <= self._max + 5:
            self._port.acknowledge(self.id, self._held)
            self._held = 0

    def release(self) -> None:
        """The call is over: whatever it left unread frees the connection's window."""
        if self._held:
            self._port.acknowledge(self.id, self._held)
            self._held = 0
        self._data.clear()

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)


class _Connection(asyncio.Protocol):
    """One client connection: h2's events in, each stream's handler as a task, writes flushed
    once per turn of the event loop."""

    def __init__(self, server: GateServer) -> None:
        self.server = server
        self.h2 = H2Connection(config=_H2)
        self.streams: dict[int, Stream[Any, Any]] = {}
        self.transport: asyncio.Transport | None = None
        self._flushing = False
        self._window: asyncio.Future[None] | None = None  # senders waiting for flow control
        self._writable: asyncio.Future[None] | None = None  # set while the transport is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        self.h2.initiate_connection()
        self.h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                                 SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
        self.h2.increment_flow_control_window(WINDOW - self.h2.inbound_flow_control_window)
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as exc:  # h2 queued a GOAWAY saying why
            log.warning("closing a connection that broke HTTP/2: %s", exc)
            self._flush()
            self.close()
            return
        for event in events:
            if isinstance(event, DataReceived):
                self._data(event)
            elif isinstance(event, RequestReceived):
                self._request(event)
            elif isinstance(event, StreamEnded):
                stream = self.streams.get(event.stream_id or 0)
                if stream is not None:
                    stream.ended()
            elif isinstance(event, StreamReset):
                self._reset(event.stream_id or 0)
            elif isinstance(event, WindowUpdated | RemoteSettingsChanged):  # windows or frames larger
                self._wake_senders()
            elif isinstance(event, ConnectionTerminated):
                self.close()
        self._schedule_flush()

    def _data(self, event: DataReceived) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None:  # its call is over: only the connection's window matters
            self.acknowledge(event.stream_id, event.flow_controlled_length)
        else:
            stream.received(event.data, event.flow_controlled_length)

    def _request(self, event: RequestReceived) -> None:
        headers = dict(event.headers)
        sid = event.stream_id
        if headers.get(b":method") != b"POST":
            self._refuse(sid, b"405")
            return
        if not headers.get(b"content-type", b"").startswith(b"application/grpc"):
            self._refuse(sid, b"415")
            return
        method = self.server.methods.get(headers.get(b":path", b""))
        if method is None:
            path = headers.get(b":path", b"").decode("ascii", "replace")
            self._end(sid, False, Status.UNIMPLEMENTED, f"no method {path} here")
            return
        stream: Stream[Any, Any] = Stream(self, sid, method, self.server.max_message_bytes)
        self.streams[sid] = stream
        stream.task = self.server.tasks.spawn(self._call(stream, method), "grpc_stream")

    async def _call(self, stream: Stream[Any, Any], method: Method) -> None:
        status, message = Status.OK, ""
        try:
            await method.call(stream)
        except GRPCError as exc:
            status, message = exc.status, exc.message
        except (StreamGoneError, asyncio.CancelledError):
            return
        except Exception:
            log.exception("the handler of stream %d failed", stream.id)
            status, message = Status.INTERNAL, "the gate failed to answer; see its log"
        finally:
            self.streams.pop(stream.id, None)
            stream.release()
            self._schedule_flush()
        if not stream.gone:
            self._end(stream.id, stream.headers_sent, status, message)

    async def send(self, stream: Stream[Any, Any], data: bytes) -> None:
        """Hand `data` to h2 as the flow-control windows allow; wait while they are shut."""
        h2, sid = self.h2, stream.id
        try:
            if not stream.headers_sent:
                h2.send_headers(sid, _HEADERS)
                stream.headers_sent = True
            sent = 0
            while True:
                room = min(h2.local_flow_control_window(sid), h2.max_outbound_frame_size)
                if len(data) - sent <= room:
                    h2.send_data(sid, data[sent:] if sent else data)
                    break
                if room > 0:  # one frame's worth now; the rest in the next round
                    h2.send_data(sid, data[sent:sent + room])
                    sent += room
                    continue
                # Shut: only the peer's WINDOW_UPDATE opens it (a peer with room to spare
                # sends none, so this waits only when there is truly no room).
                self._schedule_flush()
                self._window = self._window or asyncio.get_running_loop().create_future()
                await asyncio.shield(self._window)  # shared: one waiter's cancel is not the others'
                if stream.gone:
                    raise StreamGoneError()
        except (StreamClosedError, ProtocolError) as exc:  # h2 refuses: the stream has gone
            raise StreamGoneError() from exc
        self._schedule_flush()
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def _end(self, sid: int, headers_sent: bool, status: Status, message: str) -> None:
        trailers = [] if headers_sent else list(_HEADERS)
        trailers.append((b"grpc-status", str(int(status)).encode()))
        if message:
            trailers.append((b"grpc-message", _percent_encoded(message)))
        try:
            self.h2.send_headers(sid, trailers, end_stream=True)
        except (StreamClosedError, ProtocolError):
            return
        self._schedule_flush()

    def _refuse(self, sid: int, http_status: bytes) -> None:
        """Not a gRPC call: an HTTP status, as gRPC's protocol asks."""
        self.h2.send_headers(sid, [(b":status", http_status)], end_stream=True)

    def _reset(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is None:
            return
        stream.lost()
        stream.release()
        if stream.task is not None:
            stream.task.cancel()

    def acknowledge(self, sid: int, size: int) -> None:
        self.h2.acknowledge_received_data(size, sid)
        self._schedule_flush()

    def _wake_senders(self) -> None:
        if self._window is not None:
            self._window.set_result(None)
            self._window = None

    def _schedule_flush(self) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            self._writable.set_result(None)
            self._writable = None

    def close(self) -> None:
        """Say goodbye (GOAWAY), send what is queued, and end every call still open."""
        if self.transport is None or self.transport.is_closing():
            return
        with contextlib.suppress(ProtocolError):
            self.h2.close_connection(ErrorCodes.NO_ERROR)
        self._flush()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for sid in list(self.streams):
            self._reset(sid)
        self._wake_senders()
        self.resume_writing()


def _percent_encoded(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII as is, every other byte and '%' as %XX."""
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in text.encode()[:1024])


class GateServer:
    """The port's listening socket and its connections."""

    def __init__(
        self, handlers: list[Any], open_streams: Callable[[], int], max_message_bytes: int, tasks: Tasks
    ) -> None:
        self.tasks = tasks  # each stream's handler runs as one of these
        self.methods: dict[bytes, Method] = {
            path.encode(): method for handler in handlers for path, method in handler.__mapping__().items()}
        self.open_streams = open_streams
        self.max_message_bytes = max_message_bytes
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, sock: socket.socket, ssl: ssl.SSLContext | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=sock, ssl=ssl)

    async def stop(self, grace_s: float) -> None:
        """Stop listening; let the open streams finish for up to `grace_s`, then end them."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while self.open_streams() and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.close()
        closing = time.monotonic() + 1.0
        while self.connections and time.monotonic() < closing:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.01)
        for connection in list(self.connections):  # a client that reads nothing more
            if connection.transport is not None:
                connection.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (0: any free port), or ListenError."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port} (in use by another process?): {exc}") from exc
    return sock
