"""Protobuf ⇄ plain data. With `server.py`, the only module that imports Envoy's API."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from .exchange import Reply

Mode = processing_mode_pb2.ProcessingMode


def _mode(request_body: int, response_headers: int, response_body: int) -> processing_mode_pb2.ProcessingMode:
    """Restate the whole mode: fields left unset fall back to Envoy's defaults, not to the config."""
    return Mode(
        request_header_mode=Mode.SEND,
        request_body_mode=request_body,
        response_header_mode=response_headers,
        response_body_mode=response_body,
        request_trailer_mode=Mode.SKIP,
        response_trailer_mode=Mode.SKIP,
    )


# Paths the gate does not handle: nothing more of this exchange reaches the gate.
PASSTHROUGH = _mode(Mode.NONE, Mode.SKIP, Mode.NONE)
# After the response headers: stream the response body to the gate, chunk by chunk...
CAPTURE_BODY = _mode(Mode.BUFFERED, Mode.SEND, Mode.STREAMED)
# ...or, for a JSON answer of known size, in one message once it is all in.
CAPTURE_WHOLE = _mode(Mode.BUFFERED, Mode.SEND, Mode.BUFFERED)


@dataclass
class Continue:
    """Let the message go on, with these changes."""

    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    body: bytes | None = None
    clear_route: bool = False
    passthrough: bool = False
    capture_body: bool = False
    whole_body: bool = False  # with capture_body: one message with the whole body
    # A response body chunk sent on in place of the one received (the body streams: no length).
    chunk: bytes | None = None


def header_map(message: pb.HttpHeaders) -> dict[str, str]:
    """Header name → value; repeated headers are joined with a comma, as HTTP allows."""
    out: dict[str, str] = {}
    for h in message.headers.headers:
        raw = h.raw_value
        value = raw.decode("utf-8", "replace") if raw else h.value
        key = h.key.lower()
        out[key] = f"{out[key]},{value}" if key in out else value
    return out


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_BYTES = tuple(bytes((i,)) for i in range(0x80))


def _tag(message: Any, field: str, wire_type: int = 2) -> bytes:
    """A field's key in protobuf's wire format (2: length-delimited, 0: varint)."""
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


_SET = _tag(pb.HeaderMutation, "set_headers")
_REMOVE = _tag(pb.HeaderMutation, "remove_headers")
_HEADER = _tag(base_pb2.HeaderValueOption, "header")
_KEY = _tag(base_pb2.HeaderValue, "key")
_RAW = _tag(base_pb2.HeaderValue, "raw_value")
_OVERWRITE = _tag(base_pb2.HeaderValueOption, "append_action", 0) + _varint(
    base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
)


@lru_cache(maxsize=1024)  # most of an answer's headers repeat (content type, cache, pool)
def _set(name: str, value: str) -> bytes:
    """One `set_headers` entry: the header, overwritten if present."""
    k, v = name.encode(), value.encode()
    header = _KEY + _varint(len(k)) + k + _RAW + _varint(len(v)) + v
    option = _HEADER + _varint(len(header)) + header + _OVERWRITE
    return _SET + _varint(len(option)) + option


def _mutation(set_headers: dict[str, str], remove: list[str]) -> pb.HeaderMutation:
    """Set (overwriting) and remove headers. Written in protobuf's wire format and parsed once:
    a hit's dozen headers built as messages field by field took twice as long."""
    data = b"".join([_set(k, v) for k, v in set_headers.items()])
    for h in remove:
        b = h.encode()
        data += _REMOVE + _varint(len(b)) + b
    return pb.HeaderMutation.FromString(data)


# Answers to the request's messages repeat (the same pool's header, no change at all): each
# is built once and shared. Shared messages are only ever serialised, never changed.
_SHARED_PHASES = frozenset({"request_headers", "request_body"})
_SHARED_MAX = 256
_shared: dict[tuple[object, ...], pb.ProcessingResponse] = {}


def continue_response(phase: str, cont: Continue) -> pb.ProcessingResponse:
    """`phase` is the ProcessingRequest field being answered, e.g. "request_body"."""
    if phase not in _SHARED_PHASES or cont.body is not None or cont.chunk is not None:
        return _continue_response(phase, cont)
    key = (phase, tuple(cont.set_headers.items()), tuple(cont.remove_headers), cont.clear_route,
           cont.passthrough, cont.capture_body, cont.whole_body)
    response = _shared.get(key)
    if response is None:
        if len(_shared) >= _SHARED_MAX:  # client-chosen header names vary: stay bounded
            _shared.clear()
        response = _shared[key] = _continue_response(phase, cont)
    return response


def _continue_response(phase: str, cont: Continue) -> pb.ProcessingResponse:
    headers = dict(cont.set_headers)
    common = pb.CommonResponse(clear_route_cache=cont.clear_route)
    if cont.body is not None:
        common.body_mutation.body = cont.body
        headers["content-length"] = str(len(cont.body))
    elif cont.chunk is not None:
        if cont.chunk:
            common.body_mutation.body = cont.chunk
        else:
            common.body_mutation.clear_body = True
    if headers or cont.remove_headers:
        common.header_mutation.CopyFrom(_mutation(headers, cont.remove_headers))
    if phase in ("request_headers", "response_headers"):
        response = pb.ProcessingResponse(**{phase: pb.HeadersResponse(response=common)})
    else:
        response = pb.ProcessingResponse(**{phase: pb.BodyResponse(response=common)})
    if cont.passthrough:
        response.mode_override.CopyFrom(PASSTHROUGH)
    elif cont.capture_body:
        response.mode_override.CopyFrom(CAPTURE_WHOLE if cont.whole_body else CAPTURE_BODY)
    return response


def immediate_response(reply: Reply) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=reply.status),
            headers=_mutation(reply.headers, []),
            body=reply.body,
        )
    )


def override_timeout(seconds: float) -> pb.ProcessingResponse:
    """Ask Envoy to wait up to `seconds` for the answer to the message being processed."""
    response = pb.ProcessingResponse()
    response.override_message_timeout.FromMilliseconds(max(1, round(seconds * 1000)))
    return response
