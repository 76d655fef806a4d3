from __future__ import annotations

import pytest

from extproc.config import Guardrail as GuardrailConfig
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.stages.guardrail import Guardrail, UnreadableAnswerError

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


async def test_other_tenants_and_errors_get_no_filter_and_unreadable_answers_are_withheld() -> None:
    metrics = Metrics()
    stage = Guardrail(GuardrailConfig(tenants=["finance"]), metrics)
    error = {"content-type": "application/json"}
    for tenant, status, headers in [("shop", 200, SSE), ("finance", 400, error)]:
        ex = exchange(tenant)
        await stage.on_headers(ex)
        await stage.on_response(ex, status, headers)
        assert ex.body_filter is None, (tenant, status, headers)
    for headers in [{"content-type": "text/plain"}, {**SSE, "content-encoding": "gzip"}]:
        with pytest.raises(UnreadableAnswerError):  # the pipeline withholds it: a JSON 500 instead
            await stage.on_response(exchange("finance"), 200, headers)
    assert sample(metrics, "gate_guardrail_answers_total", source="upstream", outcome="unreadable") == 2


def test_off_by_default() -> None:
    stage = Guardrail(GuardrailConfig(), Metrics())
    assert not stage.runs("on_response")
