"""HTTP/2's frames (RFC 9113) as the gate's port writes and reads them: plain bytes, no state.

The port's peer is Envoy (or any gRPC client) on a hop the operator owns; the port reads every
frame type, checks what a broken or hostile peer could use to grow its memory (frame sizes,
flow control), and writes only what a gRPC server needs. Header blocks it writes never touch
HPACK's dynamic table (literals without indexing), so encoding them needs no state and the
common blocks are bytes made once; reading them takes `hpack`'s decoder.
"""

from __future__ import annotations

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_SIZE = 9
DEFAULT_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE until the peer says otherwise
DEFAULT_WINDOW = 65_535  # the initial flow-control window of a connection and of each stream
MAX_WINDOW = 2**31 - 1

# Frame types.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE = range(6)
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(6, 10)
# Flags.
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings.
HEADER_TABLE_SIZE, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x1, 0x3, 0x4, 0x5
# Error codes.
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 6, 7, 9

# HPACK: "dynamic table size update" to 0 (RFC 7541 §6.3), at the start of the first block
# written and of the first after the peer changes SETTINGS_HEADER_TABLE_SIZE.
EMPTY_TABLE = b"\x20"


class ProtocolError(Exception):
    """The peer broke the protocol: the connection ends with a GOAWAY carrying `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def settings(values: dict[int, int]) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


def window_update(sid: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, sid, increment.to_bytes(4, "big"))


def goaway(last_sid: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, last_sid.to_bytes(4, "big") + code.to_bytes(4, "big"))


def rst_stream(sid: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, sid, code.to_bytes(4, "big"))


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ProtocolError(FRAME_SIZE_ERROR, "a SETTINGS frame's length is not a multiple of 6")
    return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
            for i in range(0, len(payload), 6)}


def unpadded(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS frame's content without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - payload[0]]


def _integer(value: int, prefix_bits: int) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 §5.1), the prefix's flag bits zero."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 128:
        out.append(value & 127 | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Each header as a literal without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"".join(b"\0" + _integer(len(name), 7) + name + _integer(len(value), 7) + value
                    for name, value in headers)
