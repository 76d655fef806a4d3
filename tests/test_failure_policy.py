"""One failure-policy table, tested: every stage of `app.STAGES` declares what it does on its own
error and, apart from that, while the shared store is down; the pipeline built from the real
stages keeps each declaration; the README shows the table the code makes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from extproc import policy
from extproc.app import STAGES, build_pipeline
from extproc.config import Config
from extproc.exchange import Exchange, Reply
from extproc.metrics import Metrics
from extproc.pipeline import Pipeline
from extproc.stages.base import STORE_DOWN, Stage
from extproc.stages.validate import Validate
from load.stack import free_port

README = Path(__file__).resolve().parent.parent / "README.md"
BODY = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
# Every stage acts under this config (limits and budgets set, the cache on).
BUDGET = {"tokens_per_minute": {"*": 1_000_000}}
TB_DOWN = "token_budget_unavailable"
ACTIVE: dict[str, Any] = {
    "ratelimit": {"tiers": {"standard": {"tenant": {"rate": 100, "burst": 100}}}},
    "admission": {"token_budget": {"tokens_per_minute": {"*": 1_000_000}}},
}


def exchange() -> Exchange:
    headers = {":method": "POST", "content-type": "application/json", "x-api-key": "sk-any"}
    return Exchange("POST", "/v1/chat/completions", headers, request_id="req-policy")


async def run(pipeline: Pipeline) -> Reply | None:
    ex = exchange()
    reply = await pipeline.on_headers(ex)
    if reply is None:
        ex.body = orjson.dumps(BODY)
        reply = await pipeline.on_request(ex)
    await pipeline.on_done(ex)
    return reply


@pytest.fixture
async def closing() -> AsyncIterator[list[Pipeline]]:
    built: list[Pipeline] = []
    yield built
    for pipeline in built:
        await pipeline.aclose()


def built(config: dict[str, Any], into: list[Pipeline]) -> Pipeline:
    pipeline = build_pipeline(Config.model_validate(config), Metrics())
    into.append(pipeline)
    return pipeline


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_stage_declares_both_policies_itself(stage: type[Stage]) -> None:
    assert "fail_closed" in stage.__dict__ and isinstance(stage.fail_closed, bool)
    assert "store_down" in stage.__dict__ and stage.store_down in STORE_DOWN


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
async def test_a_stage_that_breaks_is_met_by_its_declared_policy(
    stage: type[Stage], monkeypatch: pytest.MonkeyPatch, closing: list[Pipeline]
) -> None:
    async def broken(self: Stage, ex: Exchange) -> Reply | None:
        raise RuntimeError("a bug in the stage")

    hooks = [h for h in ("on_headers", "on_request") if h in stage.__dict__]
    assert hooks, f"{stage.name} acts on no request hook"
    monkeypatch.setattr(stage, hooks[-1], broken)
    pipeline = built(ACTIVE, closing)
    reply = await run(pipeline)
    errors = pipeline.metrics.registry.get_sample_value(
        "gate_stage_errors_total", {"stage": stage.name, "hook": hooks[-1].removeprefix("on_")}
    )
    assert errors == 1
    if stage.fail_closed:
        assert reply is not None and reply.status == 500
        assert orjson.loads(reply.body)["error"]["code"] == "gate_error"
    else:
        assert reply is None  # skipped: the request goes on


AFTER_VALIDATION = STAGES[STAGES.index(Validate) + 1 :]


NEED_PAYLOAD = [s for s in AFTER_VALIDATION if "on_request" in s.__dict__]


@pytest.mark.parametrize("stage", NEED_PAYLOAD, ids=lambda s: s.name)
async def test_a_stage_that_finds_no_payload_fails_by_its_policy_not_quietly(
    stage: type[Stage], closing: list[Pipeline]
) -> None:
    full = built(ACTIVE, closing)
    (instance,) = [s for s in full.stages if type(s) is stage]
    pipeline = Pipeline([instance], full.config, full.metrics)
    ex = exchange()
    ex.tenant, ex.tier, ex.pool = "t", "standard", "primary"
    reply = await pipeline.on_request(ex)  # no validated payload: a bug before this stage
    if not instance.runs("on_request"):
        return
    if stage.fail_closed:
        assert reply is not None and reply.status == 500
    else:
        assert reply is None
        assert full.metrics.registry.get_sample_value(
            "gate_stage_errors_total", {"stage": stage.name, "hook": "request"}
        ) == 1


def store_down(**extra: Any) -> dict[str, Any]:
    config = {**ACTIVE, "store": {"redis_url": f"redis://127.0.0.1:{free_port()}/0", "op_timeout_ms": 50}}
    for section, values in extra.items():
        config[section] = {**config.get(section, {}), **values}
    return config


async def test_store_down_by_default_limits_are_skipped_and_the_request_goes_on(
    closing: list[Pipeline],
) -> None:
    pipeline = built(store_down(), closing)
    assert await run(pipeline) is None
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in pipeline.metrics.registry.collect() for s in family.samples
    }
    assert samples[("gate_ratelimit_decisions_total", (("limit", "store"), ("result", "skipped"),
                                                      ("tier", "standard")))] == 1
    assert samples[("gate_token_budget_total", (("result", "skipped"),))] == 1


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"ratelimit": {**ACTIVE["ratelimit"], "fail_closed_tiers": ["standard"]}}, "ratelimit_unavailable"),
        ({"ratelimit": {**ACTIVE["ratelimit"], "fail_closed_paths": ["/v1/chat"]}}, "ratelimit_unavailable"),
        ({"admission": {"token_budget": {**BUDGET, "fail_closed_tiers": ["standard"]}}}, TB_DOWN),
        ({"admission": {"token_budget": {**BUDGET, "fail_closed_paths": ["/v1/"]}}}, TB_DOWN),
    ],
)
async def test_store_down_on_a_fail_closed_path_or_tier_is_a_503(
    extra: dict[str, Any], code: str, closing: list[Pipeline]
) -> None:
    reply = await run(built(store_down(**extra), closing))
    assert reply is not None and reply.status == 503 and reply.headers["retry-after"] == "1"
    assert orjson.loads(reply.body)["error"]["code"] == code


def test_the_readme_shows_the_table_the_code_makes() -> None:
    found = re.search(
        r"<!-- failure-policy:begin -->\n(.*?)<!-- failure-policy:end -->", README.read_text(), re.S
    )
    assert found is not None, "README: the failure-policy table's markers are missing"
    assert found.group(1) == policy.table(), "regenerate it with: python -m extproc.policy"
