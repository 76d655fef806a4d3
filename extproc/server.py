"""The ext_proc stream loop: one gRPC stream per HTTP request.

Protobuf arrives here, becomes an `Exchange`, runs through the pipeline, and leaves as
protobuf again (via `wire`). Every request gets exactly one answer: an immediate reply
or a chain of CONTINUE responses.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from .config import ServerTLS
from .errors import SHOULD_RETRY, error_reply
from .exchange import Exchange, Reply, new_id, split_gate_headers
from .health import NOT_SERVING, SERVING, Health
from .pipeline import Pipeline
from .port import GateServer, GRPCError, Method, Status, Stream, listen
from .tasks import Tasks
from .tls import server_context
from .wire import Continue, continue_response, header_map, immediate_response, override_timeout

log = logging.getLogger("llm_gate.server")

REQUEST_ID_HEADER = "x-gate-request-id"
CLIENT_REQUEST_ID = "x-request-id"  # what OpenAI's SDKs read (`response._request_id`)
# Never sent on to a model server, on any path.
CREDENTIALS = ["authorization", "x-api-key"]
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(headers: dict[str, str]) -> str:
    """The client's own id (`x-request-id`, or the trace id of `traceparent`) when it is a
    plausible one; else a fresh one. It names the request in every header and log line."""
    given = headers.get(CLIENT_REQUEST_ID, "")
    if _ID.fullmatch(given):
        return given
    parts = headers.get("traceparent", "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and _ID.fullmatch(parts[1]):
        return parts[1]
    return new_id()


# A JSON answer up to this size reaches the gate in one message (Envoy buffers it; its own
# buffer limit is 1 MiB); larger ones, streams and bodies of unknown size come chunk by chunk.
WHOLE_BODY_MAX = 512 * 1024


def whole_body(headers: dict[str, str]) -> bool:
    """Whether a captured response body can come as one message: JSON of a known, small size."""
    length = headers.get("content-length", "")
    is_json = headers.get("content-type", "").split(";", 1)[0].strip().lower() == "application/json"
    return is_json and length.isdigit() and int(length) <= WHOLE_BODY_MAX


class Session:
    """The state of one stream: what we know of the request so far."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        pipeline.active += 1
        self.ex: Exchange | None = None
        self.body = bytearray()
        self.busy = 0.0
        self.answered = False

    def before(self, phase: str | None, request: pb.ProcessingRequest) -> pb.ProcessingResponse | None:
        """What goes to Envoy before a message's answer: a longer deadline for the whole
        request body when the request may wait (queue, coalescing) longer than Envoy's
        message timeout."""
        if phase == "request_body" and request.request_body.end_of_stream and self.ex is not None:
            seconds = self.pipeline.longer_timeout_s(self.ex)
            if seconds is not None:
                return override_timeout(seconds)
        return None

    async def answer(self, phase: str | None, request: pb.ProcessingRequest) -> pb.ProcessingResponse | None:
        """The answer to one message (timed: the gate's own share of the request's latency)."""
        started = time.perf_counter()
        try:
            return await self._answer_message(phase, request)
        finally:
            self.busy += time.perf_counter() - started

    async def handle(self, request: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """Every response to one message, in order."""
        phase = request.WhichOneof("request")
        early = self.before(phase, request)
        response = await self.answer(phase, request)
        return [r for r in (early, response) if r is not None]

    async def _answer_message(
        self, phase: str | None, request: pb.ProcessingRequest
    ) -> pb.ProcessingResponse | None:
        if phase == "request_headers":
            return await self._request_headers(request.request_headers)
        if phase == "request_body":
            return await self._request_body(request.request_body)
        if self.ex is None and phase in ("response_headers", "response_body"):
            # Envoy's own reply to a request no filter saw (a path it redirected or refused
            # while normalising it): nothing of it is the gate's.
            return continue_response(phase, Continue())
        if phase == "response_headers":
            return await self._response_headers(request.response_headers)
        if phase == "response_body":
            return await self._response_body(request.response_body)
        if phase is not None:
            return continue_response(phase, Continue())
        return None

    async def _request_headers(self, message: pb.HttpHeaders) -> pb.ProcessingResponse:
        raw = header_map(message)
        headers, stripped = split_gate_headers(raw)
        ex = self.ex = Exchange(
            method=headers.get(":method", "GET"),
            path=headers.get(":path", "/"),
            headers=headers,
            stripped=stripped,
            request_id=request_id(headers),
        )
        if not self.pipeline.handles(ex.path):
            if not self.pipeline.passes(ex.method, ex.path):
                return self._not_found(ex)
            ex.decision = "passthrough"
            remove = stripped + [h for h in CREDENTIALS if h in headers]
            return continue_response(
                "request_headers",
                Continue(remove_headers=remove, clear_route=bool(stripped), passthrough=True),
            )
        reply = await self.pipeline.on_headers(ex)
        if reply is None and message.end_of_stream:
            reply = await self.pipeline.on_request(ex)
        if reply is not None:
            return await self._answer(reply)
        remove = stripped + [h for h in ex.upstream_remove if h in headers]
        cont = Continue(remove_headers=remove, clear_route=bool(stripped))
        return continue_response("request_headers", cont)

    async def _request_body(self, message: pb.HttpBody) -> pb.ProcessingResponse:
        ex = self._exchange()
        self.body += message.body
        if not message.end_of_stream:
            return continue_response("request_body", Continue())
        ex.body = bytes(self.body)
        reply = await self.pipeline.on_request(ex)
        if reply is not None:
            return await self._answer(reply)
        ex.upstream_started = time.perf_counter()
        return continue_response(
            "request_body",
            Continue(set_headers=ex.upstream_headers, body=ex.upstream_body, clear_route=True),
        )

    async def _response_headers(self, message: pb.HttpHeaders) -> pb.ProcessingResponse:
        ex = self._exchange()
        headers = header_map(message)
        status = int(headers.get(":status", "0") or 0)
        ex.status = status
        withheld = await self.pipeline.on_response(ex, status, headers)
        if withheld is not None:  # the answer could not be checked: the client gets this instead
            return self._reply(ex, withheld)
        self.answered = True
        out = dict(ex.client_headers)
        out[REQUEST_ID_HEADER] = out[CLIENT_REQUEST_ID] = ex.request_id
        if ex.body_filter is not None:  # the body changes as it streams: its length is unknown
            cont = Continue(set_headers=out, remove_headers=["content-length"], capture_body=True)
        else:
            cont = Continue(set_headers=out, capture_body=ex.capture_body, whole_body=whole_body(headers))
        return continue_response("response_headers", cont)

    async def _response_body(self, message: pb.HttpBody) -> pb.ProcessingResponse:
        ex = self._exchange()
        chunk, end = message.body, message.end_of_stream
        if ex.body_filter is None:
            await self.pipeline.on_response_body(ex, chunk, end)
            return continue_response("response_body", Continue())
        # The stages (the cache's capture) see what the client gets.
        out = ex.body_filter(chunk, end)
        await self.pipeline.on_response_body(ex, out, end)
        return continue_response("response_body", Continue(chunk=None if out == chunk else out))

    async def _answer(self, reply: Reply) -> pb.ProcessingResponse:
        ex = self._exchange()
        ex.decision, ex.status = reply.decision, reply.status
        headers = {**reply.headers, **ex.client_headers, REQUEST_ID_HEADER: ex.request_id,
                   CLIENT_REQUEST_ID: ex.request_id}
        withheld = await self.pipeline.on_response(ex, reply.status, headers)
        if withheld is not None:
            return self._reply(ex, withheld)
        self.answered = True
        body = reply.body if ex.body_filter is None else ex.body_filter(reply.body, True)
        return immediate_response(Reply(reply.status, body, headers, reply.decision))

    def _reply(self, ex: Exchange, reply: Reply) -> pb.ProcessingResponse:
        """The gate's answer in place of another (nothing after it runs on this exchange)."""
        ex.decision, ex.status = reply.decision, reply.status
        self.answered = True
        headers = {**reply.headers, REQUEST_ID_HEADER: ex.request_id, CLIENT_REQUEST_ID: ex.request_id}
        return immediate_response(Reply(reply.status, reply.body, headers, reply.decision))

    def _not_found(self, ex: Exchange) -> pb.ProcessingResponse:
        """A path the gate neither handles nor lets through: nothing of it reaches a model."""
        return self._reply(ex, error_reply(
            404,
            f"{ex.method} {ex.path.split('?', 1)[0][:200]} is not served here. This gateway serves "
            + ", ".join(f"POST {p}" for p in sorted(self.pipeline.handled_paths))
            + " and "
            + ", ".join(" ".join(e) for e in sorted(self.pipeline.passthrough))
            + f". Request id {ex.request_id}.",
            code="not_found",
            headers={SHOULD_RETRY: "false"},
            decision="not_found",
        ))

    def _exchange(self) -> Exchange:
        if self.ex is None:
            raise ProtocolError("a body or response arrived before the request headers")
        return self.ex

    async def close(self) -> None:
        """The end of the exchange; the pipeline counts the stream open until its `on_done`
        ran, so a reload never closes services a finishing request still uses."""
        try:
            ex = self.ex
            if ex is None:
                return
            metrics = self.pipeline.metrics
            if ex.decision == "not_found":
                metrics.requests.labels("other", ex.decision, "404").inc()
            elif ex.decision != "passthrough":
                metrics.added_latency.observe(self.busy)
                status = str(ex.status) if ex.status is not None else "none"
                metrics.requests.labels(ex.route_path, ex.decision, status).inc()
                await self.pipeline.on_done(ex)
                self.pipeline.log_request(ex, self.busy)
        finally:
            self.pipeline.active -= 1


class ProtocolError(Exception):
    pass


Messages = Stream[pb.ProcessingRequest, pb.ProcessingResponse]


class ExternalProcessor:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.tasks = Tasks(pipeline.metrics)  # retiring pipelines, ending exchanges
        self.streams = 0  # open now

    def swap(self, pipeline: Pipeline) -> None:
        """New streams use `pipeline`; open ones finish on the old, which closes after them."""
        old, self.pipeline = self.pipeline, pipeline
        self.tasks.spawn(retire(old), "retire_pipeline")

    async def aclose(self, wait_s: float) -> None:
        """At shutdown, after the server stopped: let the streams' ends run, then close."""
        await self.tasks.aclose(wait_s)
        await self.pipeline.aclose()

    async def process(self, stream: Messages) -> None:
        """One HTTP request's messages, each answered in turn: the gate's hot path."""
        session = Session(self.pipeline)
        metrics = self.pipeline.metrics
        metrics.streams_active.inc()
        self.streams += 1
        try:
            async for request in stream:
                phase = request.WhichOneof("request")
                early = session.before(phase, request)
                if early is not None:
                    await stream.send_message(early)
                response = await session.answer(phase, request)
                if response is not None:
                    await stream.send_message(response)
        except asyncio.CancelledError:
            # Envoy ends a stream it needs no more once the response is on its way: only a
            # stream cut before the gate answered is an error.
            if not session.answered:
                metrics.stream_errors.labels("cancelled").inc()
            raise
        except ProtocolError as exc:
            metrics.stream_errors.labels("protocol").inc()
            raise GRPCError(Status.FAILED_PRECONDITION, str(exc)) from None
        finally:
            self.streams -= 1
            metrics.streams_active.dec()
            # Envoy ends a finished stream by cancelling it, and the handler is cancelled (or
            # closed) with it: an await here could be cut short, and with it the slot's
            # release, the lease's hand-back and the access line. The end of the exchange runs
            # as its own task, which nothing cancels.
            self.tasks.spawn(session.close(), "stream_end")

    def __mapping__(self) -> dict[str, Method]:
        path = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
        return {path: Method(self.process, pb.ProcessingRequest)}


async def retire(pipeline: Pipeline, poll_s: float = 0.1, limit_s: float = 600.0) -> None:
    deadline = time.monotonic() + limit_s
    while pipeline.active > 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded drain
        await asyncio.sleep(poll_s)
    await pipeline.aclose()


@dataclass
class Running:
    server: GateServer
    port: int
    health: Health
    processor: ExternalProcessor


async def start_server(
    pipeline: Pipeline, host: str, port: int, max_message_bytes: int, tls: ServerTLS | None = None
) -> Running:
    """Start the gRPC server on `port` (0: any); health says NOT_SERVING until `mark_serving`."""
    processor = ExternalProcessor(pipeline)
    health = Health()
    server = GateServer([processor, health], lambda: processor.streams, max_message_bytes, processor.tasks)
    sock = listen(host, port)
    await server.start(sock=sock, ssl=server_context(tls))
    await _set_health(health, NOT_SERVING)
    return Running(server, sock.getsockname()[1], health, processor)


async def _set_health(health: Health, status: int) -> None:
    for service in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
        await health.set(service, status)


async def mark_serving(health: Health) -> None:
    await _set_health(health, SERVING)


async def mark_draining(health: Health) -> None:
    """Still answering every stream, but asking the proxies to send new ones elsewhere."""
    await _set_health(health, NOT_SERVING)
