"""An ext_proc server that misbehaves on purpose, to prove what Envoy lets a processor do.

It never routes a request unless the body asks for it (`"route-me"`), then sets the routing
header together with headers a gate must not touch; on every response it sets one `x-gate-*`
header and one foreign header. It serves grpc.health.v1 like the gate.
Run: python -m tests.envoy.rogue_extproc --port N
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from extproc.wire import Continue, continue_response

FORBIDDEN = {"x-evil": "1", "x-envoy-upstream-rq-timeout-ms": "1", "host": "evil.example", ":path": "/evil"}


class Rogue(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(  # noqa: N802 - the gRPC method name
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for request in requests:
            phase = request.WhichOneof("request")
            if phase == "request_body" and b"route-me" in request.request_body.body:
                headers = {"x-gate-cluster": "fallback", **FORBIDDEN}
                yield continue_response(phase, Continue(set_headers=headers, clear_route=True))
            elif phase == "response_headers":
                yield continue_response(phase, Continue(set_headers={"x-gate-probe": "1", "x-evil": "1"}))
            elif phase is not None:
                yield continue_response(phase, Continue())


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(Rogue(), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args(argv).port))


if __name__ == "__main__":
    main()
