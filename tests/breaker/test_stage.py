"""The Breaker stage: re-routing through Route.send_to, and what it records per call."""

from __future__ import annotations

import orjson
import pytest

from extproc.breaker.monitor import Breakers
from extproc.breaker.state import BreakerState, Phase
from extproc.config import Breaker as BreakerConfig
from extproc.config import Config, Pool, Routing
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.stages.breaker import Breaker, Call, measure
from extproc.stages.route import Route

ROUTING = Routing(
    pools={
        "primary": Pool(cluster="primary", fallback="fallback"),
        "fallback": Pool(cluster="fallback", served_model="phi-3-mini", max_prompt_tokens=100),
    }
)


def stage(phase: Phase = Phase.CLOSED, stream_signal: str = "ttft") -> Breaker:
    config = BreakerConfig(stream_signal=stream_signal, probe_share=0.0, probe_interval_s=None)  # type: ignore[arg-type]
    breakers = Breakers(config, ROUTING.pools, Metrics(), None, clock=lambda: 1000.0, draw=lambda: 0.5)
    breakers.pools["primary"].state = BreakerState(phase, 990.0, 3)
    return Breaker(breakers, ROUTING, config, Config().validation.max_prompt_tokens)


async def routed(s: Breaker, prompt_tokens: int = 10, stream: bool = False) -> Exchange:
    payload = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ex = Exchange("POST", "/v1/chat/completions", {}, payload=payload, prompt_tokens=prompt_tokens)
    assert await Route(ROUTING).on_request(ex) is None
    assert await s.on_request(ex) is None
    return ex


async def test_closed_leaves_the_route_alone() -> None:
    ex = await routed(stage(Phase.CLOSED))
    assert ex.pool == "primary" and ex.upstream_headers["x-gate-cluster"] == "primary"
    assert ex.upstream_body is None


async def test_open_sends_to_the_fallback_with_its_model() -> None:
    s = stage(Phase.OPEN)
    ex = await routed(s)
    assert ex.pool == "fallback"
    assert ex.upstream_headers["x-gate-cluster"] == ex.client_headers["x-gate-cluster"] == "fallback"
    assert ex.upstream_body is not None and orjson.loads(ex.upstream_body)["model"] == "phi-3-mini"
    assert (
        s.breakers.metrics.registry.get_sample_value(
            "gate_breaker_reroutes_total", {"pool": "primary", "fallback": "fallback"}
        )
        == 1
    )


async def test_half_open_non_probe_goes_to_the_fallback_probe_to_the_primary() -> None:
    s = stage(Phase.HALF_OPEN)
    assert (await routed(s)).pool == "fallback"
    s.config = s.breakers.config = s.config.model_copy(update={"probe_share": 1.0})
    assert (await routed(s)).pool == "primary"


async def test_a_prompt_too_long_for_the_fallback_stays_on_the_primary() -> None:
    ex = await routed(stage(Phase.OPEN), prompt_tokens=500)
    assert ex.pool == "primary"


async def test_a_finished_call_is_one_sample_for_the_pool_it_went_to() -> None:
    s = stage(Phase.OPEN)
    ex = await routed(s)
    ex.upstream_started = 0.0  # long ago: a slow call
    await s.on_response(ex, 200, {})
    await s.on_done(ex)
    fallback = s.breakers.pools["fallback"].window
    assert fallback.stats(1000.0, 0).samples == 1
    assert s.breakers.pools["primary"].window.stats(1000.0, 0).samples == 0
    assert "breaker" not in ex.state


async def test_streams_ask_for_the_body_only_for_ttft() -> None:
    for signal, capture in (("ttft", True), ("total", False)):
        s = stage(stream_signal=signal)
        ex = await routed(s, stream=True)
        ex.upstream_started = 0.0
        await s.on_response(ex, 200, {})
        assert ex.capture_body is capture
        await s.on_done(ex)


async def test_a_reply_of_the_gate_itself_is_no_sample() -> None:
    s = stage()
    ex = await routed(s)
    await s.on_response(ex, 429, {})  # e.g. a later stage answered; never went upstream
    await s.on_done(ex)
    assert s.breakers.pools["primary"].window.stats(1000.0, 0).samples == 0


@pytest.mark.parametrize(
    ("call", "signal", "expected"),
    [
        (Call("p", 0, False, 200, 3.0), "ttft", (2.0, False)),  # JSON: headers come last
        (Call("p", 0, True, 200, 1.1, 1.5), "ttft", (0.5, False)),  # stream: first chunk
        (Call("p", 0, True, 200, 1.1, 1.5), "total", (4.0, False)),  # stream: the end
        (Call("p", 0, True, 200, 1.1, None), "ttft", (4.0, False)),  # no chunk seen: the end
        (Call("p", 0, False, 503, 1.5), "ttft", (None, True)),  # 5xx, Envoy's resets included
        (Call("p", 0, False, None, None), "ttft", (None, True)),  # no response at all
        (Call("p", 0, False, 404, 1.5), "ttft", (None, False)),  # the caller's error: no sample
    ],
)
def test_measure(call: Call, signal: str, expected: tuple[float | None, bool]) -> None:
    assert measure(call, 1.0, 5.0, signal) == expected
