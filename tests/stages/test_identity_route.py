from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from extproc.config import Caller, Identity, Routing, Rule, parse_config
from extproc.exchange import Exchange, split_gate_headers
from extproc.stages.identity import Identity as IdentityStage
from extproc.stages.identity import api_key, key_id, lower_tier, resolve
from extproc.stages.route import Route, choose_pool

KEYS = {"sk-a": Caller(tenant="acme", tier="vip"), "sk-b": Caller(tenant="beta", tier="standard")}


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"authorization": "Bearer sk-a"}, "sk-a"),
        ({"authorization": "bearer  sk-a "}, "sk-a"),
        ({"x-api-key": "sk-b"}, "sk-b"),
        ({"authorization": "Basic abc"}, None),
        ({}, None),
    ],
)
def test_api_key_sources(headers: dict[str, str], key: str | None) -> None:
    assert api_key(headers) == key


@pytest.mark.parametrize(
    ("tier", "asked", "result"),
    [
        ("vip", None, "vip"),
        ("vip", "standard", "standard"),
        ("standard", "vip", "standard"),
        ("premium", "vip", "premium"),
        ("premium", "standard", "standard"),
        ("vip", "bogus", "vip"),
    ],
)
def test_x_priority_lowers_never_raises(tier: str, asked: str | None, result: str) -> None:
    assert lower_tier(tier, asked) == result


def test_resolve_known_unknown_and_anonymous() -> None:
    config = Identity(api_keys=KEYS)
    assert resolve(config, {"x-api-key": "sk-a"}) == KEYS["sk-a"]
    assert resolve(config, {"x-api-key": "sk-zzz"}) == config.anonymous
    assert resolve(config, {}) == config.anonymous
    assert resolve(Identity(api_keys=KEYS, unknown_keys="reject"), {"x-api-key": "sk-zzz"}) is None


def test_identity_headers_count_only_when_trusted() -> None:
    spoof = {"x-tenant-id": "acme", "x-tenant-tier": "vip"}
    assert resolve(Identity(), spoof) == Identity().anonymous
    trusted = resolve(Identity(trust_identity_headers=True), spoof)
    assert trusted is not None and (trusted.tenant, trusted.tier) == ("acme", "vip")


async def test_identity_stage_rejects_unknown_keys_with_401() -> None:
    stage = IdentityStage(Identity(api_keys=KEYS, unknown_keys="reject"))
    reply = await stage.on_headers(Exchange("POST", "/", {"authorization": "Bearer nope"}))
    assert reply is not None and reply.status == 401
    assert orjson.loads(reply.body)["error"]["code"] == "invalid_api_key"
    ex = Exchange("POST", "/", {"authorization": "Bearer sk-b", "x-priority": "vip"})
    assert await stage.on_headers(ex) is None
    assert (ex.tenant, ex.tier, ex.priority, ex.key_id) == ("beta", "standard", "standard", key_id("sk-b"))
    assert "sk-b" not in str(ex.key_id)


def test_split_gate_headers_drops_every_x_gate_header() -> None:
    kept, dropped = split_gate_headers({"X-Gate-Cluster": "f", "x-gate-cache": "hit", "x-other": "1"})
    assert kept == {"x-other": "1"}
    assert sorted(dropped) == ["x-gate-cache", "x-gate-cluster"]


ROUTING = Routing(
    models={"phi-3": "fallback", "llama": "primary"},
    rules=[Rule(pool="fallback", scene_prefix="batch-"), Rule(pool="primary", path_prefix="/v1/completions")],
)


@pytest.mark.parametrize(
    ("model", "path", "scene", "pool"),
    [
        ("llama", "/v1/chat/completions", "", "primary"),
        ("phi-3", "/v1/chat/completions", "", "fallback"),
        ("unknown", "/v1/chat/completions", "", "primary"),
        ("llama", "/v1/chat/completions", "batch-x", "fallback"),
        ("phi-3", "/v1/completions", "", "primary"),
    ],
)
def test_choose_pool(model: str, path: str, scene: str, pool: str) -> None:
    assert choose_pool(ROUTING, model, path, scene) == pool


def test_no_default_pool_means_unknown_models_are_404() -> None:
    assert choose_pool(Routing(default_pool=None, models={}), "x", "/", "") is None


async def test_route_rewrites_model_for_a_pool_that_serves_another_name() -> None:
    ex = Exchange("POST", "/v1/chat/completions", {})
    ex.payload = {"model": "phi-3", "messages": []}
    assert await Route(ROUTING).on_request(ex) is None
    assert ex.upstream_headers["x-gate-cluster"] == "fallback"
    assert ex.upstream_body is not None and orjson.loads(ex.upstream_body)["model"] == "phi-3-mini"
    ex = Exchange("POST", "/v1/chat/completions", {})
    ex.payload = {"model": "llama", "messages": []}
    await Route(ROUTING).on_request(ex)
    assert ex.upstream_body is None


def test_config_names_every_unknown_pool() -> None:
    with pytest.raises(Exception) as err:
        parse_config("routing: {models: {a: nowhere}, default_pool: nope}")
    assert "models.a: unknown pool 'nowhere'" in str(err.value)
    assert "default_pool: unknown pool 'nope'" in str(err.value)


def test_keys_come_from_a_secret_file_and_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "keys.yaml"
    secret.write_text("sk-file: {tenant: filed, tier: premium}\n")
    monkeypatch.setenv("GATE_KEYS", '{"sk-env": {"tenant": "envy", "tier": "vip"}}')
    config = Identity(api_keys_file=secret, api_keys_env="GATE_KEYS", unknown_keys="reject")
    keys = config.keys()
    assert resolve(config, {"x-api-key": "sk-file"}, keys) == Caller(tenant="filed", tier="premium")
    assert resolve(config, {"x-api-key": "sk-env"}, keys) == Caller(tenant="envy", tier="vip")
    assert resolve(config, {"x-api-key": "sk-other"}, keys) is None
    secret.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="mapping"):
        config.keys()
    monkeypatch.delenv("GATE_KEYS")
    with pytest.raises(ValueError, match="GATE_KEYS"):
        Identity(api_keys_env="GATE_KEYS").keys()


async def test_a_request_without_a_key_can_be_refused() -> None:
    stage = IdentityStage(Identity(api_keys=KEYS, missing_keys="reject"))
    reply = await stage.on_headers(Exchange("POST", "/", {}))
    assert reply is not None and reply.status == 401
    assert orjson.loads(reply.body)["error"]["code"] == "missing_api_key"
    assert await stage.on_headers(Exchange("POST", "/", {"x-api-key": "sk-a"})) is None
    anonymous = IdentityStage(Identity())
    assert await anonymous.on_headers(Exchange("POST", "/", {})) is None


def test_check_config_warns_on_secrets_in_the_file_and_fails_on_an_unreadable_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from extproc.cli import main

    plain = tmp_path / "plain.yaml"
    plain.write_text(
        "identity: {api_keys: {sk-x: {tenant: t}}}\nstore: {redis_url: 'redis://:hunter2@127.0.0.1:1/0'}\n"
    )
    assert main(["check-config", str(plain)]) == 0
    out = capsys.readouterr().out
    assert "warning: identity.api_keys" in out and "warning: store.redis_url" in out
    assert "hunter2" not in out and "sk-x" not in out
    missing = tmp_path / "missing.yaml"
    missing.write_text(f"identity: {{api_keys_file: {tmp_path / 'nope.yaml'}}}\n")
    assert main(["check-config", str(missing)]) == 1
    assert "API keys cannot be read" in capsys.readouterr().out
