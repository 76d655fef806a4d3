"""gRPC health (`grpc.health.v1.Health`) on the gate's port: what Envoy's and Kubernetes' gRPC
health checks ask. Each service name has a status; `Check` reads it, `Watch` streams its changes."""

from __future__ import annotations

import asyncio
from functools import partial

from grpc_health.v1 import health_pb2

from .port import GRPCError, Method, Status, Stream

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


Asked = Stream[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]


class Health:
    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self._changed = asyncio.Condition()

    async def set(self, service: str, status: int) -> None:
        async with self._changed:
            self.statuses[service] = status
            self._changed.notify_all()

    async def check(self, stream: Asked) -> None:
        request = await stream.recv_message()
        assert request is not None
        status = self.statuses.get(request.service)
        if status is None:
            raise GRPCError(Status.NOT_FOUND, f"unknown service {request.service!r}")
        await stream.send_message(health_pb2.HealthCheckResponse(status=status))

    async def watch(self, stream: Asked) -> None:
        request = await stream.recv_message()
        assert request is not None
        service, sent = request.service, -1
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._differs, service, sent))
                sent = self.statuses.get(service, UNKNOWN)
            await stream.send_message(health_pb2.HealthCheckResponse(status=sent))

    def _differs(self, service: str, sent: int) -> bool:
        return bool(self.statuses.get(service, UNKNOWN) != sent)

    def __mapping__(self) -> dict[str, Method]:
        request = health_pb2.HealthCheckRequest
        return {
            "/grpc.health.v1.Health/Check": Method(self.check, request),
            "/grpc.health.v1.Health/Watch": Method(self.watch, request),
        }
