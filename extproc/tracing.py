"""OpenTelemetry tracing, off by default: a span per request with a child span per stage.

The request span continues the trace the request arrived with (W3C `traceparent`, which
Envoy sends when it traces, or the client's own), carries the request id and the gate's
decisions, and is exported over OTLP/HTTP to wherever the standard `OTEL_*` variables
say (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, ...). Disabled, nothing here
runs on the request path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .exchange import Exchange

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

SPAN = "trace"  # where the request's span lives in Exchange.state


class Tracing:
    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = provider.get_tracer("llm-gate") if provider is not None else None

    @classmethod
    def create(cls, enabled: bool, processor: SpanProcessor | None = None) -> Tracing:
        """Off unless `enabled`; spans go to `processor`, by default a batching OTLP/HTTP export."""
        if not enabled:
            return cls()
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if processor is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processor = BatchSpanProcessor(OTLPSpanExporter())
        name = os.environ.get("OTEL_SERVICE_NAME", "llm-gate")
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(processor)
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def begin(self, ex: Exchange) -> None:
        """The request's span, a child of the trace it arrived with."""
        if self.tracer is None or SPAN in ex.state:
            return
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        parent = extract(ex.headers)
        ex.state[SPAN] = self.tracer.start_span(
            "llm-gate " + ex.route_path, context=parent, kind=SpanKind.SERVER,
            attributes={"gate.request_id": ex.request_id, "http.request.method": ex.method,
                        "url.path": ex.route_path},
        )

    @contextlib.contextmanager
    def stage(self, ex: Exchange, name: str, hook: str) -> Iterator[None]:
        """A child span for one stage hook (nothing when tracing is off)."""
        span: Span | None = ex.state.get(SPAN)
        if self.tracer is None or span is None:
            yield
            return
        from opentelemetry.trace import set_span_in_context

        with self.tracer.start_as_current_span(f"{name}.{hook}", context=set_span_in_context(span)):
            yield

    def end(self, ex: Exchange) -> None:
        span: Span | None = ex.state.pop(SPAN, None)
        if span is None:
            return
        attributes: dict[str, Any] = {
            "gate.tenant": ex.tenant, "gate.tier": ex.tier, "gate.decision": ex.decision,
            "gate.pool": ex.pool or "", "gate.cache": ex.client_headers.get("x-gate-cache", ""),
            "gate.queue_ms": round(ex.waited_s * 1000, 1),
        }
        if ex.status is not None:
            attributes["http.response.status_code"] = ex.status
        span.set_attributes(attributes)
        span.end()

    def aclose(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
