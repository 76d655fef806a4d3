"""`llm-gate scheduler --pool NAME --port P`: the admission queue of one pool over gRPC."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
from pathlib import Path

import grpc

from ..config import Config, load_config_or_report
from ..metrics import Metrics
from ..tls import bind
from .local import LocalScheduler
from .proto import CLASS_TO_PB, acquire_response, pb, pb_grpc, ticket_of
from .queue import Refused

log = logging.getLogger("llm_gate.scheduler")


def refusal_message(outcome: Refused, pool: str) -> str:
    eta = math.ceil(outcome.eta_s)
    if outcome.reason in ("queue_full", "evicted"):
        return f"Pool '{pool}' is at capacity and its queue is full. Retry in about {eta} s."
    return f"Pool '{pool}' cannot take this request in time (about {eta} s to a free slot). Retry later."


class SchedulerService(pb_grpc.SchedulerServicer):
    def __init__(self, scheduler: LocalScheduler) -> None:
        self.scheduler = scheduler

    async def Acquire(  # noqa: N802 - the gRPC method name
        self, request: pb.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcquireResponse:
        s = self.scheduler
        if request.pool and request.pool != s.pool:
            message = f"this scheduler serves pool '{s.pool}', not '{request.pool}'"
            refusal = pb.Refusal(reason=pb.REFUSAL_REASON_UNKNOWN_POOL, message=message)
            return pb.AcquireResponse(refused=refusal)
        ticket = ticket_of(request)
        outcome = await s.acquire(ticket, request.prompt_tokens)
        message = refusal_message(outcome, s.pool) if isinstance(outcome, Refused) else ""
        return acquire_response(outcome, s.queue.policy.lease_s, message)

    async def Release(  # noqa: N802
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        return pb.ReleaseResponse(released=self.scheduler.release(request.grant_id))

    async def Renew(  # noqa: N802
        self, request: pb.RenewRequest, context: grpc.aio.ServicerContext
    ) -> pb.RenewResponse:
        return pb.RenewResponse(unknown=self.scheduler.renew(list(request.grant_ids)))

    async def Status(  # noqa: N802
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        st = self.scheduler.status()
        classes = [
            pb.ClassStatus(
                priority=CLASS_TO_PB[c], queued=n, oldest_wait_ms=round(st.oldest_wait_s[c] * 1000)
            )
            for c, n in st.queued.items()
        ]
        age = st.reading_age_s if math.isfinite(st.reading_age_s) else 0.0
        return pb.StatusResponse(
            pool=st.pool,
            limit=st.limit,
            in_flight=st.in_flight,
            queued=sum(st.queued.values()),
            queued_tokens=st.queued_tokens,
            classes=classes,
            capacity_source=st.source,
            reading_age_ms=round(age * 1000),
            memory_pressure=st.pressure,
            drain_per_s=st.drain_per_s,
            capacity_factor=st.factor,
        )


async def serve(config: Config, pool: str, host: str, port: int, metrics_port: int | None) -> None:
    metrics = Metrics()
    if metrics_port is not None:
        metrics.serve(metrics_port, host)
    admission = config.admission
    scheduler = LocalScheduler(pool, admission.policy(pool), admission.pool(pool).capacity, metrics)
    await scheduler.start()
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(SchedulerService(scheduler), server)  # type: ignore[no-untyped-call]
    if bind(server, f"{host}:{port}", admission.scheduler_tls) == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    log.info("scheduler for pool %s on %s:%d (capacity from %s)", pool, host, port, scheduler.limit.source)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)
    await scheduler.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate scheduler", description=__doc__)
    parser.add_argument("--pool", required=True, help="the pool this scheduler admits for")
    parser.add_argument("--config", type=Path, help="the gate's YAML (its admission section)")
    parser.add_argument("--host", default="127.0.0.1", help="address of the gRPC and metrics ports")
    parser.add_argument("--port", type=int, default=50061, help="gRPC port (the gates' scheduler address)")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 = off)")
    args = parser.parse_args(argv)
    config = load_config_or_report(args.config)
    if config is None:
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    import uvloop

    uvloop.run(serve(config, args.pool, args.host, args.port, args.metrics_port or None))
    return 0
