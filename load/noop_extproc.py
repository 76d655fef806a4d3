"""A no-op ext_proc server: CONTINUE to every message. The floor the gate is measured against."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import grpc
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc


class Noop(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(  # noqa: N802 - the gRPC method name
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for request in requests:
            phase = request.WhichOneof("request")
            if phase in ("request_headers", "response_headers"):
                yield pb.ProcessingResponse(**{phase: pb.HeadersResponse()})
            elif phase in ("request_body", "response_body"):
                yield pb.ProcessingResponse(**{phase: pb.BodyResponse()})


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 2 << 20)])
    pb_grpc.add_ExternalProcessorServicer_to_server(Noop(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(serve(parser.parse_args(argv).port))


if __name__ == "__main__":
    main()
