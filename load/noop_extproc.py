"""The floors the gate is measured against: a no-op ext_proc (CONTINUE to every message) and,
with `--route`, the least any Python gate does (read the headers, parse the JSON body, set
`x-gate-cluster` in its answer to the body, read the response headers). On grpcio's asyncio
server, or with `--gate-port` on the one the gate itself serves on (`extproc/port.py`)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import grpc
import orjson
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.metrics import Metrics
from extproc.port import GateServer, Method, Stream, listen
from extproc.tasks import Tasks
from extproc.wire import Continue, continue_response

ROUTED = continue_response(
    "request_body", Continue(set_headers={"x-gate-cluster": "primary"}, clear_route=True)
)


class Noop(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, route: bool = False) -> None:
        self.route = route

    async def Process(  # noqa: N802 - the gRPC method name
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for request in requests:
            phase = request.WhichOneof("request")
            if phase in ("request_headers", "response_headers"):
                if self.route:
                    headers = getattr(request, phase).headers.headers
                    _ = {h.key: h.raw_value.decode() for h in headers}
                yield pb.ProcessingResponse(**{phase: pb.HeadersResponse()})
            elif phase == "request_body" and self.route:
                orjson.loads(request.request_body.body)
                yield ROUTED
            elif phase in ("request_body", "response_body"):
                yield pb.ProcessingResponse(**{phase: pb.BodyResponse()})


class NoopOnGatePort:
    def __init__(self, route: bool) -> None:
        self.noop = Noop(route)

    async def process(self, stream: Stream[pb.ProcessingRequest, pb.ProcessingResponse]) -> None:
        async for response in self.noop.Process(stream, None):
            await stream.send_message(response)

    def __mapping__(self) -> dict[str, Method]:
        path = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
        return {path: Method(self.process, pb.ProcessingRequest)}


async def serve(port: int, route: bool, gate_port: bool = False) -> None:
    if gate_port:
        server = GateServer([NoopOnGatePort(route)], lambda: 0, 2 << 20, Tasks(Metrics()))
        await server.start(listen("127.0.0.1", port))
        await asyncio.Event().wait()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 2 << 20)])
    pb_grpc.add_ExternalProcessorServicer_to_server(Noop(route), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--route", action="store_true", help="the least a gate does: parse, route")
    parser.add_argument("--gate-port", action="store_true", help="on the gate's own gRPC server")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.port, args.route, args.gate_port))


if __name__ == "__main__":
    main()
