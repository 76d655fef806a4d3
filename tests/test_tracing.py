"""OpenTelemetry: a span per request continuing the request's trace, a child per stage."""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from extproc.config import Config
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.pipeline import Pipeline
from extproc.stages.identity import Identity
from extproc.stages.route import Route
from extproc.stages.validate import Validate
from extproc.tracing import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Traced(Pipeline):
    def __init__(self, tracing: Tracing) -> None:
        config = Config()
        stages = [Identity(config.identity), Validate(config.validation), Route(config.routing)]
        super().__init__(stages, config, Metrics())
        self.tracing = tracing


async def test_a_request_span_continues_the_trace_and_each_stage_is_a_child() -> None:
    exporter = InMemorySpanExporter()
    pipeline = Traced(Tracing.create(True, SimpleSpanProcessor(exporter)))
    headers = {
        "content-type": "application/json",
        "x-request-id": "req-7",
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
        "authorization": "Bearer sk-secret",
    }
    ex = Exchange("POST", "/v1/chat/completions", headers, request_id="req-7")
    ex.body = b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}]}'
    assert await pipeline.on_headers(ex) is None
    assert await pipeline.on_request(ex) is None
    ex.status = 200
    pipeline.log_request(ex, 0.001)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request = spans["llm-gate /v1/chat/completions"]
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert request.parent is not None and format(request.parent.span_id, "016x") == PARENT_ID
    assert request.attributes is not None
    assert request.attributes["gate.request_id"] == "req-7" and request.attributes["gate.pool"] == "primary"
    for child in ("identity.on_headers", "validate.on_headers", "validate.on_request", "route.on_request"):
        assert spans[child].parent is not None and spans[child].parent.span_id == request.context.span_id
    assert not any("sk-secret" in str(s.attributes) for s in spans.values())
    pipeline.tracing.aclose()


async def test_tracing_off_records_nothing_on_the_exchange() -> None:
    pipeline = Traced(Tracing.create(False))
    ex = Exchange("POST", "/v1/chat/completions", {"content-type": "application/json"})
    await pipeline.on_headers(ex)
    assert not pipeline.tracing.enabled and "trace" not in ex.state
