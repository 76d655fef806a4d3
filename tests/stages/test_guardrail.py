from __future__ import annotations

from extproc.config import Guardrail as GuardrailConfig
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.stages.guardrail import Guardrail

SSE = {"content-type": "text/event-stream"}
ANSWER = b'data: {"choices":[{"index":0,"delta":{"content":"mail a@b.io"},"finish_reason":"stop"}]}\n\n'


def exchange(tenant: str) -> Exchange:
    ex = Exchange(method="POST", path="/v1/chat/completions", headers={"accept-encoding": "gzip"})
    ex.tenant = tenant
    return ex


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_listed_tenant_gets_a_filter_that_redacts_and_counts() -> None:
    metrics = Metrics()
    stage = Guardrail(GuardrailConfig(tenants=["finance"]), metrics)
    ex = exchange("finance")
    await stage.on_headers(ex)
    assert "accept-encoding" in ex.upstream_remove
    await stage.on_response(ex, 200, SSE)
    assert ex.body_filter is not None and ex.capture_body
    out = ex.body_filter(ANSWER, False) + ex.body_filter(b"", True)
    assert b"a@b.io" not in out and b"[redacted:email]" in out
    assert sample(metrics, "gate_guardrail_redactions_total", kind="email") == 1
    assert sample(metrics, "gate_guardrail_answers_total", source="upstream", outcome="redacted") == 1


async def test_other_tenants_errors_and_unreadable_bodies_get_no_filter() -> None:
    metrics = Metrics()
    stage = Guardrail(GuardrailConfig(tenants=["finance"]), metrics)
    for tenant, status, headers in [
        ("shop", 200, SSE),
        ("finance", 400, {"content-type": "application/json"}),
        ("finance", 200, {"content-type": "text/plain"}),
        ("finance", 200, {**SSE, "content-encoding": "gzip"}),
    ]:
        ex = exchange(tenant)
        await stage.on_headers(ex)
        await stage.on_response(ex, status, headers)
        assert ex.body_filter is None, (tenant, status, headers)
    assert sample(metrics, "gate_guardrail_answers_total", source="upstream", outcome="unreadable") == 2


def test_off_by_default() -> None:
    stage = Guardrail(GuardrailConfig(), Metrics())
    assert not stage.runs("on_response")
