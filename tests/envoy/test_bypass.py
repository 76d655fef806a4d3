"""Black-box: nothing reaches a model server without the gate, through every Envoy variant.

Every endpoint a vLLM server offers, the simulator's own admin endpoints, and many spellings
of the gate's paths (escaped slashes, dot segments, doubled slashes, case, encoded letters,
matrix parameters, NUL) are sent raw (no client-side normalisation) through each variant: the
standalone bootstrap, the include snippet in an operator's Envoy, the include snippet behind
an operator's careless catch-all route (the gate's own allow-list must hold there), and the
Istio variants for every supported Istio version. The simulators record every request that
reaches them; only requests the gate routed (`x-gate-cluster`) and the allow-list may be there.
"""

from __future__ import annotations

import copy
import http.client
import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from extproc import envoy_config as ec
from extproc import envoy_istio
from load.stack import Stack, free_port
from tests.envoy.helpers import LOOPBACK, envoy
from tests.istio.mesh import apply_patches, gateway_bootstrap, make_certs

CHAT = json.dumps({"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
# What a vLLM server answers besides the gate's paths (vLLM's OpenAI server, 0.6-0.11).
VLLM_POST = [
    "/v1/embeddings", "/v1/responses", "/invocations", "/pooling", "/score", "/v1/score",
    "/rerank", "/v1/rerank", "/v2/rerank", "/classify", "/tokenize", "/detokenize",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/start_profile", "/stop_profile", "/reset_prefix_cache",
    "/sleep", "/wake_up", "/collective_rpc", "/ping", "/v1/models",
    "/admin/faults", "/admin/config", "/admin/reset",  # the simulator's own
]
VLLM_GET = [
    "/metrics", "/version", "/ping", "/load", "/server_info", "/is_sleeping", "/docs",
    "/openapi.json", "/v1/responses/resp_1", "/v1/chat/completions", "/admin/state",
]
# Other spellings of a gated or forbidden path.
ENCODINGS = [
    "/v1/chat%2Fcompletions", "/v1/chat%2fcompletions", "/v1%2Fchat%2Fcompletions",
    "/v1/chat%5Ccompletions", "//v1/chat/completions", "/v1//chat/completions",
    "/v1/chat/completions/", "/v1/./chat/completions", "/v1/x/../chat/completions",
    "/v1/chat/completions/.", "/v1/chat/%63ompletions", "/v1/%63hat/completions",
    "/%761/chat/completions", "/V1/CHAT/COMPLETIONS", "/v1/chat/completions%00",
    "/v1/chat/completions;x=1", "/v1/chat/completions%20", "/v1/chat/completions?x=1",
    "/v1/embeddings%2F..%2Fchat/completions", "/./v1/embeddings", "//v1/embeddings",
    "/v1/embeddings/", "/v1/%65mbeddings", "/v1/chat/completions/../../v1/embeddings",
    "/v1/models/../embeddings", "/v1/models%2F..%2Fembeddings", "/health/../v1/embeddings",
    "/v1/models/../../admin/faults", "/v1/models/", "//v1/models", "/v1/models%2F",
    "/%2e%2e/v1/embeddings", "/v1/chat/completions#x",
]
PROBES = (
    [("POST", p) for p in VLLM_POST]
    + [("GET", p) for p in VLLM_GET]
    + [("POST", p) for p in ENCODINGS]
    + [("GET", "/v1/models"), ("GET", "/health"), ("DELETE", "/health"), ("PUT", "/v1/chat/completions")]
)
ALLOWED = {("GET", "/v1/models"), ("GET", "/health")}


def raw_request(port: int, method: str, path: str, host: str) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request with the path exactly as given (no client normalises it)."""
    body = CHAT.encode() if method in ("POST", "PUT") else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer probe\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    with socket.create_connection((LOOPBACK, port), timeout=15) as sock:
        sock.sendall(head.encode() + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def arrivals(stack: Stack) -> list[dict[str, Any]]:
    found = []
    for pool in stack.pool_ports:
        found += httpx.get(stack.sim_url(pool) + "/admin/arrivals").json()["arrivals"]
    return found


def reset(stack: Stack) -> None:
    for pool in stack.pool_ports:
        httpx.post(stack.sim_url(pool) + "/admin/reset")


def probe_all(port: int, stack: Stack, host: str = "llm.local") -> dict[tuple[str, str], int]:
    """Send every probe; every answer is either the model's (gated) or a JSON error or a
    redirect to the unescaped path. Returns the statuses."""
    reset(stack)
    statuses = {}
    for method, path in PROBES:
        status, headers, body = raw_request(port, method, path, host)
        statuses[(method, path)] = status
        if 300 <= status < 400:
            assert "%" not in headers.get("location", "%"), (method, path, headers)
            continue
        if (method, path) not in ALLOWED and status >= 400:
            error = json.loads(body)["error"]  # OpenAI's error shape, whoever answered
            assert error["message"] and error["code"], (method, path, body)
    ungated = [
        a
        for a in arrivals(stack)
        if not a["gated"] and (a["method"], a["path"]) not in ALLOWED and a["path"] != "/admin/reset"
    ]
    assert ungated == [], f"requests reached a model server around the gate: {ungated}"
    return statuses


def assert_expected(statuses: dict[tuple[str, str], int]) -> None:
    assert statuses[("GET", "/v1/models")] == 200
    assert statuses[("POST", "/v1/embeddings")] == 404
    assert statuses[("POST", "/admin/faults")] == 404
    assert statuses[("GET", "/metrics")] == 404


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as running:
        yield running


def test_the_detector_sees_an_ungated_request(stack: Stack) -> None:
    """The simulators' record is what the test relies on: a request sent to one directly shows."""
    reset(stack)
    httpx.post(stack.sim_url("primary") + "/v1/embeddings", json={"input": "x"})
    assert {"method": "POST", "path": "/v1/embeddings", "gated": False} in arrivals(stack)


def test_standalone_bootstrap(stack: Stack) -> None:
    statuses = probe_all(stack.envoy_port, stack)
    assert_expected(statuses)
    # Normalised spellings of the chat path are the chat path: gated and answered by the model.
    assert statuses[("POST", "//v1/chat/completions")] == 200
    assert statuses[("POST", "/v1/./chat/completions")] == 200
    assert statuses[("POST", "/v1/chat/completions?x=1")] == 200
    # An escaped slash is redirected to its plain spelling, not decoded behind the client's back.
    assert statuses[("POST", "/v1/chat%2Fcompletions")] in (301, 302, 307, 308)


def operator_envoy(stack: Stack, listen: int, admin: int, careless: bool) -> dict[str, Any]:
    """An operator's own Envoy with the include snippet pasted in as its header says; careless:
    their own catch-all route to the pool, and none of the snippet's HCM settings but the filter."""
    snippet = ec.include_snippet([(LOOPBACK, p) for p in stack.gate_ports])
    doc = ec.bootstrap(
        listen=(LOOPBACK, listen),
        admin=(LOOPBACK, admin),
        gate=[],
        pools={pool: [(LOOPBACK, port)] for pool, port in stack.pool_ports.items()},
    )
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [*snippet["http_filters"], *hcm["http_filters"]]
    doc["static_resources"]["clusters"].insert(0, snippet["clusters"][0])
    vhost = hcm["route_config"]["virtual_hosts"][0]
    if careless:
        for key in ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action"):
            hcm.pop(key)
        vhost["routes"] = [
            *copy.deepcopy(snippet["routes"][:2]),
            {"match": {"prefix": "/"}, "route": {"cluster": "primary", "timeout": "0s"}},
        ]
    else:
        hcm.update(snippet["path_normalization"])
        vhost["routes"] = snippet["routes"]
    return doc


@pytest.mark.parametrize("careless", [False, True], ids=["as-documented", "catch-all-route"])
def test_include_snippet_in_an_operators_envoy(stack: Stack, careless: bool) -> None:
    listen, admin = free_port(), free_port()
    with envoy(operator_envoy(stack, listen, admin, careless), listen, admin):
        statuses = probe_all(listen, stack)
    assert_expected(statuses)
    if careless:  # the gate answers what the operator's route would have let through
        assert statuses[("POST", "/v1/chat%2Fcompletions")] == 404


@pytest.mark.parametrize("version", envoy_istio.ISTIO_VERSIONS)
@pytest.mark.parametrize("variant", ["istioctl", "gateway-api"])
def test_istio_variants(stack: Stack, variant: str, version: str) -> None:
    docs = envoy_istio.documents(variant, version=version)
    certs = make_certs(Path(tempfile.mkdtemp(prefix="llm-gate-certs-")))
    listen, admin, sidecar = free_port(), free_port(), free_port()
    base, gateway = gateway_bootstrap(
        docs[1:], listen=listen, admin=admin, sidecar=sidecar,
        gate=stack.gate_ports[0], pools=stack.pool_ports, certs=certs,
    )
    with envoy(apply_patches(base, docs[0], gateway), listen, admin):
        statuses = probe_all(listen, stack, host=envoy_istio.LLM_HOST)
    assert_expected(statuses)
    assert statuses[("POST", "//v1/chat/completions")] == 200
