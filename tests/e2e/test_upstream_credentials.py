"""Credentials of our own upstream: model servers that require a key serve through the gate,
and no client key or identity header ever reaches them (real Envoy, real simulators)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from load.stack import Stack

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    key_file = tmp_path_factory.mktemp("keys") / "fallback.key"
    key_file.write_text("sk-pool-key\n")
    key = str(key_file)
    config = {
        "identity": {"api_keys": {"sk-client-secret": {"tenant": "acme", "tier": "vip"}}},
        "routing": {
            "pools": {
                "primary": {"cluster": "primary", "fallback": "fallback", "api_key_file": key},
                "fallback": {"cluster": "fallback", "served_model": "phi-3-mini", "api_key_file": key},
            }
        },
    }
    with Stack(gate_config=config, sim_args=["--api-key", "sk-pool-key"]) as s:
        yield s


def test_pools_that_require_a_key_serve_and_never_see_a_client_key(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        spoof = {"x-tenant-id": "spoof", "x-priority": "vip"}
        keys = ({"authorization": "Bearer sk-client-secret"}, {"x-api-key": "sk-client-secret"})
        for model in ("llama-3-8b", "phi-3"):
            for i, key in enumerate(keys):
                body = {"model": model, "messages": [{"role": "user", "content": f"hello {model} {i}"}]}
                r = client.post(CHAT, json=body, headers={**key, **spoof})
                assert r.status_code == 200, r.text
        models = client.get("/v1/models", headers={"authorization": "Bearer sk-client-secret"})
    assert models.status_code == 401  # passthrough paths carry no key: the client's stays here
    for pool in ("primary", "fallback"):
        state = httpx.get(stack.sim_url(pool) + "/admin/state").json()
        assert state["credentials"] == ["Bearer sk-pool-key"], pool
        assert "x-api-key" not in state["header_names"] and "x-tenant-id" not in state["header_names"]
        assert "x-priority" not in state["header_names"]
        assert state["served"] >= 2


def test_a_pool_key_that_cannot_be_read_stops_the_gate_at_start(tmp_path: Path) -> None:
    from extproc.config import Pool

    with pytest.raises(ValueError, match="NO_SUCH_KEY_VARIABLE"):
        Pool(cluster="c", api_key_env="NO_SUCH_KEY_VARIABLE").upstream_key()
    with pytest.raises(FileNotFoundError):
        Pool(cluster="c", api_key_file=tmp_path / "missing").upstream_key()
