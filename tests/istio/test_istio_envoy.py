"""The shipped EnvoyFilters merged into an Istio-shaped gateway config, run in real Envoy with
the gate behind an mTLS sidecar: traffic for the LLM host passes the gate, client-sent
`x-gate-*` cannot choose a pool, and the gateway's other host is left alone."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from extproc import envoy_istio
from load.stack import Stack, free_port
from tests.envoy.helpers import LOOPBACK, envoy, stat

from .mesh import OTHER_HOST, apply_patches, gateway_bootstrap, make_certs

REPO = Path(__file__).resolve().parent.parent.parent
CHAT = "/v1/chat/completions"
LLM = {"host": envoy_istio.LLM_HOST}
GATE_CLUSTER = "outbound|50051||llm-gate.llm-gate.svc.cluster.local"


def shipped(variant: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / envoy_istio.FILES[variant]).read_text()) if d]


def chat(text: str) -> dict[str, Any]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": text}], "max_tokens": 8}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as running:
        yield running


def test_istioctl_and_helm_variants_patch_alike() -> None:
    patches = [shipped(v)[0]["spec"]["configPatches"] for v in ("istioctl", "helm")]
    assert patches[0] == patches[1]  # one traffic run below covers both


@pytest.mark.parametrize("variant", ["istioctl", "gateway-api"])
def test_llm_traffic_passes_the_gate_over_mtls_and_only_the_gate_picks_the_pool(
    stack: Stack, variant: str
) -> None:
    docs = shipped(variant)
    certs = make_certs(Path(tempfile.mkdtemp(prefix="llm-gate-certs-")))
    listen, admin, sidecar = free_port(), free_port(), free_port()
    base, gateway = gateway_bootstrap(
        docs[1:],
        listen=listen,
        admin=admin,
        sidecar=sidecar,
        gate=stack.gate_ports[0],
        pools=stack.pool_ports,
        certs=certs,
    )
    doc = apply_patches(base, docs[0], gateway)
    with (
        envoy(doc, listen, admin) as admin_url,
        httpx.Client(base_url=f"http://{LOOPBACK}:{listen}", timeout=15) as client,
    ):
        r = client.post(CHAT, json=chat("hello through the mesh"), headers=LLM)
        assert r.status_code == 200, r.text
        assert r.headers["x-gate-cluster"] == "primary" and r.headers["x-gate-request-id"]
        assert stat(admin_url, f"cluster.{GATE_CLUSTER}.ssl.handshake") >= 1  # mTLS to the sidecar
        assert stat(admin_url, f"listener.127.0.0.1_{sidecar}.ssl.handshake") >= 1

        # A client-sent x-gate-cluster chooses nothing, on gated and passed-through paths alike.
        spoof = {**LLM, "x-gate-cluster": "fallback"}
        r = client.post(CHAT, json=chat("spoofed"), headers=spoof)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith(
            "[llama-3-8b]"
        )
        models = client.get("/v1/models", headers=spoof).json()
        assert [m["id"] for m in models["data"]] == ["llama-3-8b"]

        # A body over Istio's 32 KiB listener buffer still reaches the gate whole.
        r = client.post(CHAT, json=chat("long " * 8_000), headers=LLM)
        assert r.status_code == 200, r.text[:300]

        # Envoy's own errors on the LLM host are OpenAI JSON (a body over 1 MiB, unsized).
        def chunks() -> Iterator[bytes]:
            for _ in range(12):
                yield b"x" * 100_000

        r = client.post(CHAT, content=chunks(), headers={**LLM, "content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert r.headers["x-should-retry"] == "false" and r.headers["x-request-id"]

        # Another host on the gateway: its errors are left as they are, and on a shared gateway
        # (a Gateway API gateway is the LLM's own) the gate never sees its requests.
        r = client.post(
            CHAT, json=chat("other app"), headers={"host": OTHER_HOST, "x-gate-cluster": "primary"}
        )
        assert r.status_code == 503
        if variant != "gateway-api":
            assert "x-gate-request-id" not in r.headers
        assert not r.headers.get("content-type", "").startswith("application/json"), r.text

        # The gate cluster is health-checked with grpc.health.v1 over the same mTLS.
        deadline = time.monotonic() + 15
        while stat(admin_url, f"cluster.{GATE_CLUSTER}.health_check.success") < 1:
            assert time.monotonic() < deadline, httpx.get(admin_url + "/stats?filter=health_check").text
            time.sleep(0.2)
        flags = [
            line for line in httpx.get(admin_url + "/clusters").text.splitlines() if "health_flags" in line
        ]
        assert f"{GATE_CLUSTER}::127.0.0.1:{sidecar}::health_flags::healthy" in flags
