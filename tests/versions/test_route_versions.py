"""Route with versions: the sticky choice, the trusted canary header, the version told and scoped."""

from __future__ import annotations

import time

import pytest

from extproc.cache.keys import question
from extproc.config import Caller, Identity, parse_config
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.stages.identity import Identity as IdentityStage
from extproc.stages.route import Route
from extproc.versions.rollout import RolloutState
from extproc.versions.traffic import Override, Traffic

CONFIG = parse_config(
    """
routing:
  pools:
    chat-v1: {cluster: chat-v1}
    chat-v2: {cluster: chat-v2}
    primary: {cluster: primary}
  models: {}
  versions:
    chat:
      versions:
        - {name: v1, pool: chat-v1, weight: 100}
        - {name: v2, pool: chat-v2, canary: true}
identity:
  api_keys:
    sk-tester: {tenant: qa, canary: true}
    sk-user: {tenant: acme}
"""
)


async def routed(route: Route, key: str, headers: dict[str, str] | None = None, user: str = "") -> Exchange:
    raw = {"authorization": f"Bearer {key}", **(headers or {})}
    if user:
        raw["x-user-id"] = user
    ex = Exchange("POST", "/v1/chat/completions", raw)
    assert await IdentityStage(CONFIG.identity).on_headers(ex) is None
    ex.payload = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    assert await route.on_request(ex) is None
    return ex


async def test_canary_header_counts_only_for_keys_that_allow_it() -> None:
    route = Route(CONFIG.routing, Traffic(), metrics=Metrics())
    tester = await routed(route, "sk-tester", {"x-canary": "true"})
    assert (tester.version, tester.upstream_headers["x-gate-cluster"]) == ("v2", "chat-v2")
    assert tester.client_headers["x-gate-version"] == "v2"
    for i in range(50):  # at weight 0, nobody else reaches the canary, header or not
        other = await routed(route, "sk-user", {"x-canary": "true"}, user=f"u{i}")
        assert (other.version, other.upstream_headers["x-gate-cluster"]) == ("v1", "chat-v1")
    plain = await routed(route, "sk-tester")
    assert plain.version == "v1"


async def test_traffic_layers_config_then_etcd_then_shared_state() -> None:
    traffic = Traffic()
    route = Route(CONFIG.routing, traffic)

    async def canary_share() -> float:
        versions = [(await routed(route, "sk-user", user=f"u{i}")).version for i in range(400)]
        return versions.count("v2") / len(versions)

    assert await canary_share() == 0
    traffic.set_etcd({"chat": Override(traffic=100)})
    assert await canary_share() == 1
    traffic.set_shared("chat", RolloutState("v2", "rolled_back", 0.0, 0, time.time(), 3))
    assert await canary_share() == 0  # the shared state wins over etcd
    traffic.set_shared("chat", RolloutState("v3", "manual", 100.0, 0, time.time(), 4))
    assert await canary_share() == 1  # a state about another canary is ignored
    traffic.set_etcd({"chat": Override(stable="v2")})
    traffic.set_shared("chat", None)
    assert await canary_share() == 1  # etcd named the canary the stable version


@pytest.mark.parametrize("share_cache", [False, True])
async def test_answer_cache_scopes_by_version_unless_shared(share_cache: bool) -> None:
    versions = CONFIG.routing.versions["chat"].model_copy(update={"share_cache": share_cache})
    routing = CONFIG.routing.model_copy(update={"versions": {"chat": versions}})
    route = Route(routing, Traffic())
    stable = await routed(route, "sk-tester")
    canary = await routed(route, "sk-tester", {"x-canary": "true"})
    assert (stable.version, canary.version) == ("v1", "v2")
    scopes = {
        question(ex.payload or {}, ex.route_path, ex.tenant, False, ex.cache_version).scope
        for ex in (stable, canary)
    }
    assert len(scopes) == (1 if share_cache else 2)


async def test_unversioned_models_route_as_before_and_keep_their_cache_keys() -> None:
    route = Route(CONFIG.routing, Traffic())
    ex = Exchange("POST", "/v1/chat/completions", {})
    ex.payload = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
    assert await route.on_request(ex) is None
    assert ex.upstream_headers["x-gate-cluster"] == "primary" and ex.version is None
    assert "x-gate-version" not in ex.client_headers
    assert question(ex.payload, "/p", "t", False, None) == question(ex.payload, "/p", "t", False)


async def test_outcomes_feed_the_versions_metrics() -> None:
    metrics = Metrics()
    route = Route(CONFIG.routing, Traffic(), metrics=metrics)
    ex = await routed(route, "sk-tester", {"x-canary": "true"})
    ex.upstream_started, ex.status = time.perf_counter(), 503
    await route.on_done(ex)
    labels = {"model": "chat", "version": "v2"}
    errors = metrics.registry.get_sample_value("gate_version_errors_total", labels)
    requests = metrics.registry.get_sample_value("gate_version_requests_total", labels)
    assert (errors, requests) == (1.0, 1.0)


def test_trusted_identity_headers_never_allow_the_canary() -> None:
    from extproc.stages.identity import resolve

    caller = resolve(Identity(trust_identity_headers=True), {"x-tenant-id": "qa"})
    assert caller == Caller(tenant="qa") and not caller.canary
