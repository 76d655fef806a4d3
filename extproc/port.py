"""The gate's gRPC port as Envoy needs it: grpclib's server with the message size limit, many
streams on one connection, writes coalesced per turn of the event loop, and a graceful stop."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.protocol import H2Protocol
from grpclib.server import Server
from h2.settings import SettingCodes


class ListenError(OSError):
    """The gate's port is taken: restarting will not help."""


# Streams Envoy may keep open on one connection: requests wait in the admission queue or for
# a coalesced answer with their stream open (h2's own default is 100).
MAX_STREAMS = 65_536


class _Codec(ProtoCodec):
    """Protobuf, with the size limit a gRPC server sets on what it receives."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_bytes:
            raise GRPCError(Status.RESOURCE_EXHAUSTED,
                            f"message of {len(data)} bytes, more than {self.max_bytes} accepted")
        return super().decode(data, message_type)


class _Batched:
    """The connection's transport, its writes in one turn of the event loop sent in one system
    call: grpclib writes a stream's headers, each message and its trailers apart, and Envoy
    read each apart (a quarter more of Envoy's CPU per request; coalesced, the answers of
    several streams leave together and Envoy spends less than beside grpcio's server:
    `load/results/bench_gate.md`)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.unsent: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self.unsent:
            asyncio.get_running_loop().call_soon(self.flush)
        self.unsent.append(data)

    def flush(self) -> None:
        unsent, self.unsent = self.unsent, []
        if unsent and not self.transport.is_closing():
            self.transport.write(unsent[0] if len(unsent) == 1 else b"".join(unsent))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, abort...
        return getattr(self.transport, name)


class _Protocol(H2Protocol):
    def connection_made(self, transport: Any) -> None:
        super().connection_made(cast(asyncio.BaseTransport, _Batched(transport)))
        self.connection._connection.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
        self.connection.flush()


class GateServer(Server):
    """grpclib's server: HTTP/2 and gRPC framing on the event loop's own thread. grpcio's server
    hands every message between its threads and the loop's; against it, the gate and Envoy
    spend about half the CPU per request, and a miss at one connection is 0.7-0.8 ms sooner
    (`load/results/bench_gate.md`)."""

    def __init__(self, handlers: list[Any], open_streams: Callable[[], int], max_message_bytes: int) -> None:
        super().__init__(handlers, codec=_Codec(max_message_bytes))
        self.open_streams = open_streams

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        return _Protocol(protocol.handler, protocol.config, protocol.h2_config)

    async def stop(self, grace_s: float) -> None:
        """Stop listening; let the open streams finish for up to `grace_s`, then cancel them."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while self.open_streams() and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.05)
        self.close()
        await self.wait_closed()


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
