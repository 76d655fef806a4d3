"""Every metric the gate exports, prefix `gate_`, in one registry per process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gate_requests",
            "Requests by path, decision and status the client got.",
            ["path", "decision", "status"],
            registry=r,
        )
        self.stage_seconds = Histogram(
            "gate_stage_seconds",
            "Time spent in each stage hook.",
            ["stage", "hook"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.added_latency = Histogram(
            "gate_added_latency_seconds",
            "The gate's own processing time per request, summed over its ext_proc messages.",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.streams_active = Gauge("gate_streams_active", "Open ext_proc streams.", registry=r)
        self.stream_errors = Counter(
            "gate_stream_errors",
            "ext_proc streams that ended with an error.",
            ["kind"],
            registry=r,
        )

        self.store_errors = Counter(
            "gate_store_errors",
            "Store calls that failed or timed out (the request went on).",
            ["op", "error"],
            registry=r,
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
