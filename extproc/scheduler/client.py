"""The gate's side of a remote scheduler: acquire, release, and keep leases alive.

Fail open: when the scheduler cannot be reached, `acquire` returns None and the request
goes on without queueing. gRPC reconnects on its own (with a short backoff), so when the
scheduler is back the next request queues again.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from ..metrics import Metrics
from ..tasks import Tasks
from ..tls import channel_credentials
from .proto import acquire_request, outcome_of, pb, pb_grpc
from .queue import Granted, Refused, Ticket
from .settings import SchedulerTLS

log = logging.getLogger("llm_gate.scheduler.client")

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
]


class RemoteScheduler:
    def __init__(
        self,
        pool: str,
        address: str,
        metrics: Metrics,
        timeout_s: float,
        lease_s: float,
        tls: SchedulerTLS | None = None,
    ) -> None:
        self.pool = pool
        self.address = address
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        if tls is None:
            self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.aio.secure_channel(address, channel_credentials(tls), options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.SchedulerStub(self.channel)  # type: ignore[no-untyped-call]
        self.held: set[str] = set()
        self.tasks = Tasks(metrics)
        self._renewer: asyncio.Task[None] | None = None

    async def acquire(self, ticket: Ticket, prompt_tokens: int, tenant: str) -> Granted | Refused | None:
        """A grant, a refusal, or None when the scheduler could not be asked (fail open)."""
        self._start_renewer()
        wait = ticket.deadline_s if ticket.deadline_s is not None else 30.0
        request = acquire_request(self.pool, ticket, prompt_tokens, tenant)
        try:
            response = await self.stub.Acquire(request, timeout=wait + self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            self._failed("acquire", exc)
            # It may have granted before the error: the release by id is a no-op if not.
            self._release_later(ticket.id)
            return None
        except asyncio.CancelledError:
            self._release_later(ticket.id)  # left the queue, or gave back a grant in flight
            raise
        outcome = outcome_of(response, ticket)
        if isinstance(outcome, Granted):
            self.held.add(ticket.id)
        return outcome

    async def release(self, id: str, tokens_used: int = 0, latency_s: float = 0.0, ok: bool = True) -> None:
        self.held.discard(id)
        request = pb.ReleaseRequest(
            grant_id=id, tokens_used=tokens_used, latency_ms=round(latency_s * 1000), ok=ok
        )
        try:
            await self.stub.Release(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            self._failed("release", exc)  # the lease will expire on the scheduler's side

    def _release_later(self, id: str) -> None:
        self.tasks.spawn(self.release(id), "scheduler_release")

    def _failed(self, op: str, exc: grpc.aio.AioRpcError) -> None:
        code = exc.code().name if exc.code() is not None else "UNKNOWN"
        self.metrics.scheduler_errors.labels(self.pool, op, code).inc()
        log.debug("scheduler %s for pool %s: %s failed: %s", self.address, self.pool, op, code)

    def _start_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = self.tasks.spawn(self._renew_forever(), "scheduler_renew")

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if not self.held:
                continue
            try:
                answer = await self.stub.Renew(
                    pb.RenewRequest(grant_ids=sorted(self.held)), timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                self._failed("renew", exc)
                continue
            self.held.difference_update(answer.unknown)

    async def close(self) -> None:
        await self.tasks.aclose(wait_s=0.5)  # releases in flight get a moment
        await self.channel.close()
