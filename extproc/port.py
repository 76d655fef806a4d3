"""The gate's gRPC port: HTTP/2's frames (`http2.py`), gRPC's framing on top, nothing else.

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
import logging
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Generic, TypeVar, cast

from hpack import Decoder
from hpack.exceptions import HPACKError

from . import http2
from .http2 import PREFACE, ProtocolError
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
# a coalesced answer with their stream open (many HTTP/2 servers allow 100).
MAX_STREAMS = 65_536
WINDOW = 4 << 20  # what a client may send ahead, per stream and per connection
MAX_HEADER_BLOCK = 64 << 10  # a request's headers: Envoy sends well under 1 KB
_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_RESPONSE = http2.header_block(_HEADERS)
_OK_TRAILERS = http2.header_block([(b"grpc-status", b"0")])
_FRAME_HEADER = struct.Struct(">HBBBI")  # length (24 bits: 16 + 8), type, flags, stream id


class Stream(Generic[Request, Response]):
    """One call: the client's messages (`recv_message`, or `async for`) and the answers
    (`send_message`). The handler's return ends the call with status OK."""

    def __init__(self, port: _Connection, stream_id: int, method: Method, max_bytes: int) -> None:
        self._port, self.id, self._type, self._max = port, stream_id, method.request, max_bytes
        self._data = bytearray()  # received, not yet read
        self._held = 0  # received bytes not yet given back to the client's flow-control window
        self.client_done = False  # the client sent its last message
        self.window = port.stream_window  # what the client lets the port send on this stream
        self.in_window = WINDOW  # what the client may still send on it
        self.unacknowledged = 0  # read, not yet given back in a WINDOW_UPDATE
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
            if self.client_done:
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
        self.client_done = True
        self._wake()

    def lost(self) -> None:
        self.gone = True
        self._wake()

    def _give_back(self) -> None:
        """The client may send more once what it sent is read; while less than one whole
        message is waiting here, at once (a message larger than the window must get in)."""
        if self._held and len(self._data) <= self._max + 5:
            self._port.acknowledge(self, self._held)
            self._held = 0

    def release(self) -> None:
        """The call is over: whatever it left unread frees the connection's window."""
        if self._held:
            self._port.acknowledge(None, self._held)
            self._held = 0
        self._data.clear()

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/2's frames in, each stream's handler as a task, writes
    flushed once per turn of the event loop."""

    def __init__(self, server: GateServer) -> None:
        self.server = server
        self.streams: dict[int, Stream[Any, Any]] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_sid = 0  # the newest stream the client opened
        self.window = http2.DEFAULT_WINDOW  # what the client lets the port send on the connection
        self.stream_window = http2.DEFAULT_WINDOW  # ... and on each new stream (its SETTINGS)
        self.max_frame = http2.DEFAULT_FRAME  # the largest frame the client reads
        self._in_window = WINDOW  # what the client may still send on the connection
        self._unacknowledged = 0  # read, not yet given back to the client in a WINDOW_UPDATE
        self._rest = b""  # the start of a frame not yet whole
        self._preface = False
        self._decoder = Decoder()
        self._block: tuple[int, int, bytearray] | None = None  # a header block in pieces: sid, flags
        self._table_update = True  # the next header block written starts with an HPACK size update
        self._out: list[bytes] = []
        self._flushing = False
        self._window: asyncio.Future[None] | None = None  # senders waiting for flow control
        self._writable: asyncio.Future[None] | None = None  # set while the transport is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        ours = {http2.MAX_CONCURRENT_STREAMS: MAX_STREAMS, http2.INITIAL_WINDOW_SIZE: WINDOW}
        self._out += [http2.settings(ours), http2.window_update(0, WINDOW - http2.DEFAULT_WINDOW)]
        self._flush()

    def data_received(self, data: bytes) -> None:
        buf = self._rest + data if self._rest else data
        pos, size = 0, len(buf)
        try:
            if not self._preface:
                if not (buf.startswith(PREFACE) or PREFACE.startswith(buf)):
                    raise ProtocolError(http2.PROTOCOL_ERROR, "not HTTP/2: no client preface")
                if size < len(PREFACE):
                    self._rest = buf
                    return
                self._preface, pos = True, len(PREFACE)
            while size - pos >= http2.HEADER_SIZE and not self.closed:
                high, low, kind, flags, sid = _FRAME_HEADER.unpack_from(buf, pos)
                length = high << 8 | low
                if length > http2.DEFAULT_FRAME:
                    raise ProtocolError(http2.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                end = pos + http2.HEADER_SIZE + length
                if end > size:
                    break
                self._frame(kind, flags, sid & 0x7FFFFFFF, buf[pos + http2.HEADER_SIZE:end])
                pos = end
        except ProtocolError as exc:
            log.warning("closing a connection that broke HTTP/2: %s", exc)
            self.close(exc.code)
            return
        self._rest = buf[pos:]
        self._schedule_flush()

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block is not None and kind != http2.CONTINUATION:
            raise ProtocolError(http2.PROTOCOL_ERROR, "a header block interrupted")
        if kind == http2.DATA:
            self._data(flags, sid, payload)
        elif kind == http2.HEADERS:
            block = http2.unpadded(flags, payload)
            block = block[5:] if flags & http2.PRIORITY_FLAG else block
            if flags & http2.END_HEADERS:
                self._headers(sid, flags, block)
            else:  # the rest comes in CONTINUATION frames
                self._block = (sid, flags, bytearray(block))
        elif kind == http2.CONTINUATION:
            if self._block is None or self._block[0] != sid:
                raise ProtocolError(http2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            _, first, pieces = self._block
            pieces += payload
            if len(pieces) > MAX_HEADER_BLOCK:
                raise ProtocolError(http2.PROTOCOL_ERROR, "a header block over 64 KB")
            if flags & http2.END_HEADERS:
                self._block = None
                self._headers(sid, first, bytes(pieces))
        elif kind == http2.WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == http2.SETTINGS:
            if not flags & http2.ACK:
                self._settings(payload)
        elif kind == http2.PING:
            if not flags & http2.ACK:
                self._out.append(http2.frame(http2.PING, http2.ACK, 0, payload))
        elif kind == http2.RST_STREAM:
            self._reset(sid)
        elif kind == http2.GOAWAY:
            self.close()
        elif kind == http2.PUSH_PROMISE:
            raise ProtocolError(http2.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY and frame types this port does not know: nothing to do (RFC 9113 §5.5)

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        """A whole header block: a new stream's request, or the trailers of one (open or over)."""
        try:
            headers = dict(self._decoder.decode(block, raw=True))
        except HPACKError as exc:
            raise ProtocolError(http2.COMPRESSION_ERROR, f"an unreadable header block: {exc}") from exc
        if sid > self.last_sid:
            if not sid % 2:
                raise ProtocolError(http2.PROTOCOL_ERROR, f"a client opened stream {sid}, an even number")
            self.last_sid = sid
            self._request(sid, headers)
        stream = self.streams.get(sid)
        if stream is not None and flags & http2.END_STREAM:
            stream.ended()

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        flow = len(payload)
        self._in_window -= flow
        stream = self.streams.get(sid)
        if stream is not None:
            stream.in_window -= flow
        if self._in_window < 0 or (stream is not None and stream.in_window < 0):
            raise ProtocolError(http2.FLOW_CONTROL_ERROR, "data past the window the port gave")
        data = http2.unpadded(flags, payload)
        if stream is None:  # its call is over: only the connection's window matters
            if not sid or sid > self.last_sid:
                raise ProtocolError(http2.PROTOCOL_ERROR, f"data on stream {sid}, never opened")
            self.acknowledge(None, flow)
            return
        stream.received(data, flow)
        if flags & http2.END_STREAM:
            stream.ended()

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(http2.FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not 4 bytes long")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not sid:
            self.window += increment
            if not increment or self.window > http2.MAX_WINDOW:
                raise ProtocolError(http2.FLOW_CONTROL_ERROR, "a window update of 0 or past 2^31")
        elif (stream := self.streams.get(sid)) is not None:
            stream.window += increment
        self._wake_senders()

    def _settings(self, payload: bytes) -> None:
        values = http2.parse_settings(payload)
        window = values.get(http2.INITIAL_WINDOW_SIZE)
        if window is not None:
            if window > http2.MAX_WINDOW:
                raise ProtocolError(http2.FLOW_CONTROL_ERROR, "an initial window past 2^31")
            for stream in self.streams.values():
                stream.window += window - self.stream_window
            self.stream_window = window
        frame_size = values.get(http2.MAX_FRAME_SIZE)
        if frame_size is not None:
            if not http2.DEFAULT_FRAME <= frame_size < 1 << 24:
                raise ProtocolError(http2.PROTOCOL_ERROR, f"a maximum frame size of {frame_size}")
            self.max_frame = frame_size
        if http2.HEADER_TABLE_SIZE in values:
            self._table_update = True
        self._out.append(http2.frame(http2.SETTINGS, http2.ACK, 0))
        self._wake_senders()

    def _request(self, sid: int, headers: dict[bytes, bytes]) -> None:
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
        if len(self.streams) >= MAX_STREAMS:
            self._out.append(http2.rst_stream(sid, http2.REFUSED_STREAM))
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
        """Frame `data` as the flow-control windows allow; wait while they are shut."""
        if stream.gone or self.closed:
            raise StreamGoneError()
        out, sid = self._out, stream.id
        if not stream.headers_sent:
            out.append(self._header_frame(sid, _RESPONSE, 0))
            stream.headers_sent = True
        sent, size = 0, len(data)
        while True:
            room = min(stream.window, self.window, self.max_frame)
            if size - sent <= room:
                out.append(http2.frame(http2.DATA, 0, sid, data[sent:] if sent else data))
                stream.window -= size - sent
                self.window -= size - sent
                break
            if room > 0:  # one frame's worth now; the rest in the next round
                out.append(http2.frame(http2.DATA, 0, sid, data[sent:sent + room]))
                stream.window -= room
                self.window -= room
                sent += room
                continue
            # Shut: only the client's WINDOW_UPDATE opens it (a client with room to spare
            # sends none, so this waits only when there is truly no room).
            self._schedule_flush()
            self._window = self._window or asyncio.get_running_loop().create_future()
            await asyncio.shield(self._window)  # shared: one waiter's cancel is not the others'
            if stream.gone or self.closed:
                raise StreamGoneError()
        self._schedule_flush()
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def _header_frame(self, sid: int, block: bytes, flags: int) -> bytes:
        """A HEADERS frame; the port's blocks are far smaller than a frame (grpc-message is
        cut at 1 KB), so none needs a CONTINUATION."""
        if self._table_update:
            block, self._table_update = http2.EMPTY_TABLE + block, False
        return http2.frame(http2.HEADERS, http2.END_HEADERS | flags, sid, block)

    def _end(self, sid: int, headers_sent: bool, status: Status, message: str) -> None:
        if self.closed:
            return
        if headers_sent and status == Status.OK and not message:
            block = _OK_TRAILERS
        else:
            trailers = [] if headers_sent else list(_HEADERS)
            trailers.append((b"grpc-status", str(int(status)).encode()))
            if message:
                trailers.append((b"grpc-message", _percent_encoded(message)))
            block = http2.header_block(trailers)
        self._out.append(self._header_frame(sid, block, http2.END_STREAM))
        self._schedule_flush()

    def _refuse(self, sid: int, http_status: bytes) -> None:
        """Not a gRPC call: an HTTP status, as gRPC's protocol asks."""
        block = http2.header_block([(b":status", http_status)])
        self._out.append(self._header_frame(sid, block, http2.END_STREAM))

    def _reset(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is None:
            return
        stream.lost()
        stream.release()
        if stream.task is not None:
            stream.task.cancel()

    def acknowledge(self, stream: Stream[Any, Any] | None, size: int) -> None:
        """`size` bytes received have been read: the client may send as much again. Given back
        in WINDOW_UPDATEs of half a window or more, not one per message."""
        self._unacknowledged += size
        if self._unacknowledged >= WINDOW // 2:
            self._out.append(http2.window_update(0, self._unacknowledged))
            self._in_window += self._unacknowledged
            self._unacknowledged = 0
        if stream is not None and not stream.client_done:
            stream.unacknowledged += size
            if stream.unacknowledged >= WINDOW // 2:
                self._out.append(http2.window_update(stream.id, stream.unacknowledged))
                stream.in_window += stream.unacknowledged
                stream.unacknowledged = 0
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
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            self._writable.set_result(None)
            self._writable = None

    def close(self, code: int = http2.NO_ERROR) -> None:
        """Say goodbye (GOAWAY), send what is queued, and end every call still open."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        self.closed = True
        self._out.append(http2.goaway(self.last_sid, code))
        self._flush()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
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
