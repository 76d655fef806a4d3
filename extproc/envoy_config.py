"""Envoy files for the gate: a standalone bootstrap and an include snippet.

`envoy/envoy.yaml` and `envoy/ext_proc-include.yaml` are this module's output with the
default ports (a test keeps them in sync); run `llm-gate envoy-config --help` for others.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

GATE_CLUSTER = "llm_gate"
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
BUFFER_LIMIT = 1_048_576  # matches validation.max_body_bytes


def _endpoints(addresses: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "endpoints": [
            {
                "lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}}
                    for h, p in addresses
                ]
            }
        ]
    }


def gate_cluster(gate: list[tuple[str, int]]) -> dict[str, Any]:
    """The gate speaks gRPC: the cluster MUST be HTTP/2 (validate mode does not catch it)."""
    return {
        "name": GATE_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {"cluster_name": GATE_CLUSTER, **_endpoints(gate)},
    }


def ext_proc_filter(failure_mode_allow: bool, message_timeout_s: float) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": GATE_CLUSTER}},
            # false: gate down → 500 at once (nothing bypasses the gate's checks);
            # true: gate down → requests go upstream unchecked and unrouted by the gate.
            "failure_mode_allow": failure_mode_allow,
            # Envoy's default is 200 ms; it must exceed the longest queue wait.
            "message_timeout": f"{message_timeout_s:g}s",
            "max_message_timeout": f"{max(message_timeout_s, 60):g}s",
            "allow_mode_override": True,
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_header_mode": "SEND",
                "response_body_mode": "NONE",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
        },
    }


# The network-level layer beneath the gate's latency breaker: Envoy retries calls that
# failed outright (reset, refused, 5xx) within a budget, ejects endpoints that keep
# failing, and caps what one pool cluster may hold. The gate's breaker acts on slowness,
# which none of these see; it only counts what is left after Envoy's retries.
def retry_policy() -> dict[str, Any]:
    return {
        "retry_on": "reset,connect-failure,refused-stream,5xx",
        "num_retries": 2,
        "retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"},
    }


def pool_protection() -> dict[str, Any]:
    # Retries in flight may be at most 20% of the requests in flight (at least 3).
    budget = {"budget_percent": {"value": 20.0}, "min_retry_concurrency": 3}
    limits = {"max_connections": 1024, "max_pending_requests": 1024, "max_requests": 1024}
    return {
        "circuit_breakers": {"thresholds": [{"priority": "DEFAULT", **limits, "retry_budget": budget}]},
        "outlier_detection": {
            "consecutive_5xx": 5,
            "consecutive_gateway_failure": 3,
            "interval": "5s",
            "base_ejection_time": "30s",
            "max_ejection_percent": 50,
        },
    }


def _openai_error(message: str, type: str, code: str) -> dict[str, Any]:
    return {"json_format": {"error": {"message": message, "type": type, "param": None, "code": code}}}


def local_reply_config() -> dict[str, Any]:
    """Envoy's own error replies in OpenAI's error shape, as the gate's are.

    Only replies Envoy made itself are rewritten: upstream failures carry a response flag,
    and Envoy's buffer-limit 413 comes for a body without content-length (the gate answers
    a too-large content-length itself). The gate's immediate responses have neither.
    """
    too_large = {
        "and_filter": {
            "filters": [
                {
                    "status_code_filter": {
                        "comparison": {
                            "op": "EQ",
                            "value": {"default_value": 413, "runtime_key": "llm_gate.413"},
                        }
                    }
                },
                {
                    "header_filter": {
                        "header": {"name": "content-length", "present_match": True, "invert_match": True}
                    }
                },
            ]
        }
    }
    message = f"The request body is over {BUFFER_LIMIT} bytes, the proxy's buffer limit; send a smaller one."
    return {
        "mappers": [
            {
                "filter": {"response_flag_filter": {}},
                "body_format_override": _openai_error(
                    "%LOCAL_REPLY_BODY%", "upstream_error", "%RESPONSE_FLAGS%"
                ),
            },
            {
                "filter": too_large,
                "body_format_override": _openai_error(message, "invalid_request_error", "request_too_large"),
            },
        ]
    }


def pool_cluster(name: str, addresses: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": name, **_endpoints(addresses)},
        **pool_protection(),
    }


def routes(pools: list[str], default: str) -> list[dict[str, Any]]:
    by_header = [
        {
            "match": {
                "prefix": "/",
                "headers": [{"name": "x-gate-cluster", "string_match": {"exact": pool}}],
            },
            "route": {"cluster": pool, "timeout": "300s", "retry_policy": retry_policy()},
        }
        for pool in pools
    ]
    fallthrough = {"cluster": default, "timeout": "300s", "retry_policy": retry_policy()}
    return [*by_header, {"match": {"prefix": "/"}, "route": fallthrough}]


def bootstrap(
    *,
    listen: tuple[str, int],
    admin: tuple[str, int],
    gate: list[tuple[str, int]],
    pools: dict[str, list[tuple[str, int]]],
    default_pool: str = "primary",
    failure_mode_allow: bool = False,
    message_timeout_s: float = 35.0,
) -> dict[str, Any]:
    hcm = {
        "@type": HCM,
        "stat_prefix": "llm_gate",
        # Append the peer address to x-forwarded-for, so the gate sees who connected
        # (ratelimit.trusted_hops counts the proxies in front of Envoy).
        "use_remote_address": True,
        # A client's own x-request-id names its request end to end (gate, logs, SDK).
        "preserve_external_request_id": True,
        "codec_type": "AUTO",
        "stream_idle_timeout": "300s",
        "local_reply_config": local_reply_config(),
        "route_config": {
            "name": "llm",
            "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": routes(list(pools), default_pool)}],
        },
        "http_filters": [
            *([ext_proc_filter(failure_mode_allow, message_timeout_s)] if gate else []),
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
        ],
    }
    listener = {
        "name": "llm",
        "address": {"socket_address": {"address": listen[0], "port_value": listen[1]}},
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
    }
    clusters = [gate_cluster(gate)] if gate else []
    clusters += [pool_cluster(n, a) for n, a in pools.items()]
    return {
        "admin": {"address": {"socket_address": {"address": admin[0], "port_value": admin[1]}}},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    }


def include_snippet(gate: list[tuple[str, int]], failure_mode_allow: bool = False) -> dict[str, Any]:
    """Paste `http_filters[0]` before your router filter and add `clusters[0]`."""
    return {"http_filters": [ext_proc_filter(failure_mode_allow, 35.0)], "clusters": [gate_cluster(gate)]}


def dump(doc: dict[str, Any], header: str = "") -> str:
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return (host or "127.0.0.1", int(port))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate envoy-config", description=__doc__)
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 10000))
    parser.add_argument("--admin", type=_address, default=("127.0.0.1", 9901))
    parser.add_argument("--gate", type=_address, action="append", help="gate endpoint; repeat per worker")
    parser.add_argument(
        "--pool",
        action="append",
        help="NAME=HOST:PORT[,HOST:PORT]; repeat per pool (default primary and fallback)",
    )
    parser.add_argument("--default-pool", default="primary")
    parser.add_argument("--failure-mode-allow", action="store_true")
    parser.add_argument("--message-timeout", type=float, default=35.0)
    parser.add_argument("--include", action="store_true", help="write the include snippet instead")
    parser.add_argument("--istio", action="store_true", help="write an Istio EnvoyFilter instead")
    parser.add_argument("--out", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    gate = args.gate or [("127.0.0.1", 50051)]
    pools: dict[str, list[tuple[str, int]]] = {}
    for spec in args.pool or ["primary=127.0.0.1:8001", "fallback=127.0.0.1:8002"]:
        name, _, addresses = spec.partition("=")
        pools[name] = [_address(a) for a in addresses.split(",")]
    if args.include:
        text = dump(include_snippet(gate, args.failure_mode_allow), INCLUDE_HEADER)
    elif args.istio:
        host, port = args.gate[0] if args.gate else ("llm-gate.llm-gate.svc.cluster.local", 50051)
        text = dump(istio_envoyfilter(host, port, failure_mode_allow=args.failure_mode_allow), ISTIO_HEADER)
    else:
        doc = bootstrap(
            listen=args.listen,
            admin=args.admin,
            gate=gate,
            pools=pools,
            default_pool=args.default_pool,
            failure_mode_allow=args.failure_mode_allow,
            message_timeout_s=args.message_timeout,
        )
        text = dump(doc, BOOTSTRAP_HEADER)
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


BOOTSTRAP_HEADER = """\
# Envoy in front of vLLM pools, with LLM Gate as its ext_proc service.
# Generated by `llm-gate envoy-config`; edit the flags, not this file.
# Clients → 127.0.0.1:10000; gate gRPC on 127.0.0.1:50051; pools `primary` and `fallback`.
# The gate sets `x-gate-cluster` and Envoy routes on it; requests the gate does not
# handle go to the default pool.
"""

ISTIO_HEADER = """\
# LLM Gate on Istio: the ext_proc filter before the router of the ingress gateway, and
# the gate's HTTP/2 cluster (a Service `llm-gate` in namespace `llm-gate`, port 50051).
# Generated by `llm-gate envoy-config --istio --gate HOST:PORT`. Then route on the
# `x-gate-cluster` header in your VirtualService (one http match per pool).
"""

INCLUDE_HEADER = """\
# LLM Gate for your own Envoy: put `http_filters[0]` before the router filter of your
# HTTP connection manager, add `clusters[0]`, and route on the `x-gate-cluster` header
# (one route per pool cluster). Keep per_connection_buffer_limit_bytes at or above the
# gate's validation.max_body_bytes (1 MiB by default).
# For your pool clusters and routes, copy the retry_policy, circuit_breakers and
# outlier_detection of envoy/envoy.yaml: the network-level layer beneath the gate's breaker,
# and the HCM's local_reply_config, so Envoy's own errors are OpenAI-style JSON too.
"""


def istio_envoyfilter(
    gate_host: str = "llm-gate.llm-gate.svc.cluster.local",
    gate_port: int = 50051,
    *,
    namespace: str = "istio-system",
    workload_labels: dict[str, str] | None = None,
    context: str = "GATEWAY",
    failure_mode_allow: bool = False,
) -> dict[str, Any]:
    """The same filter as an Istio EnvoyFilter: on the ingress gateway by default.

    Route on `x-gate-cluster` with a VirtualService header match per pool.
    """
    cluster = {**gate_cluster([(gate_host, gate_port)]), "type": "STRICT_DNS"}
    http_filter = {
        "context": context,
        "listener": {
            "filterChain": {
                "filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": "envoy.filters.http.router"},
                }
            }
        },
    }
    patches = [
        {
            "applyTo": "HTTP_FILTER",
            "match": http_filter,
            "patch": {"operation": "INSERT_BEFORE", "value": ext_proc_filter(failure_mode_allow, 35.0)},
        },
        {
            "applyTo": "CLUSTER",
            "match": {"context": context},
            "patch": {"operation": "ADD", "value": cluster},
        },
        {
            "applyTo": "NETWORK_FILTER",
            "match": {
                "context": context,
                "listener": {
                    "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}
                },
            },
            "patch": {
                "operation": "MERGE",
                "value": {"typed_config": {"@type": HCM, "local_reply_config": local_reply_config()}},
            },
        },
    ]
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "llm-gate", "namespace": namespace},
        "spec": {
            "workloadSelector": {"labels": workload_labels or {"istio": "ingressgateway"}},
            "configPatches": patches,
        },
    }
