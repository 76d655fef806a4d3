"""Envoy files for the gate: a standalone bootstrap and an include snippet.

`envoy/envoy.yaml` and `envoy/ext_proc-include.yaml` are this module's output with the
default ports (a test keeps them in sync); run `llm-gate envoy-config --help` for others.
The Istio objects come from `extproc.envoy_istio` and share the pieces defined here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

GATE_CLUSTER = "llm_gate"
TYPE = "type.googleapis.com/"
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
EARLY_HEADER_MUTATION = (
    "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation"
)
CEL_FILTER = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"
BUFFER_LIMIT = 1_048_576  # matches validation.max_body_bytes
GATED_PATHS = ("/v1/chat/completions", "/v1/completions")  # the gate's server.handled_paths
# Streams to the gate: every request holds one for its whole life, queued or answering.
# The pools take 1,024 each (their circuit breakers) and the admission queues hold the rest.
GATE_STREAMS = 8192
# What the gate may change through ext_proc, request and response alike: its own headers
# (x-gate-cluster routes), the body's content-length, the pool's credentials, the identity
# headers it keeps from the pool, and the retry and rate-limit advice on its answers.
GATE_MUTABLE_HEADERS = (
    r"x-(gate|ratelimit)-.+|content-(length|type)|authorization|x-api-key|x-(tenant-.+|priority|user-id)"
    r"|x-request-id|trace(parent|state)|retry-after.*|x-should-retry|cache-control"
)
# A JSON answer has no bytes until it is complete: the route's idle timeout bounds the time
# to the first byte. A streamed answer may take as long as it likes while tokens flow.
UPSTREAM_IDLE_S = 300
MAX_QUEUE_S = 240  # the longest wait the gate may ask for with override_message_timeout


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


def gate_http2() -> dict[str, Any]:
    """HTTP/2 to the gate, with pings so a dead peer is noticed on an idle connection too."""
    keepalive = {"interval": "10s", "timeout": "3s", "connection_idle_interval": "30s"}
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": HTTP_OPTIONS,
            "explicit_http_config": {"http2_protocol_options": {"connection_keepalive": keepalive}},
        }
    }


def gate_health_checks() -> list[dict[str, Any]]:
    """grpc.health.v1 on the gate's port: a worker that stops serving takes no new streams."""
    return [
        {
            "timeout": "1s",
            "interval": "2s",
            "no_traffic_interval": "5s",
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "grpc_health_check": {},
        }
    ]


def gate_outlier_detection() -> dict[str, Any]:
    """A worker whose streams fail to open (refused, reset) is ejected before a health check sees it."""
    return {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": 2,
        "consecutive_gateway_failure": 2,
        "interval": "1s",
        "base_ejection_time": "5s",
        "max_ejection_percent": 50,
    }


def gate_circuit_breakers(streams: int) -> dict[str, Any]:
    limits = {
        "max_connections": 1024,
        "max_pending_requests": streams,
        "max_requests": streams,
        "max_retries": 3,
    }
    return {"thresholds": [{"priority": "DEFAULT", **limits}, {"priority": "HIGH", **limits}]}


def gate_cluster(gate: list[tuple[str, int]], streams: int = GATE_STREAMS) -> dict[str, Any]:
    """The gate speaks gRPC: the cluster MUST be HTTP/2 (validate mode does not catch it)."""
    return {
        "name": GATE_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "lb_policy": "LEAST_REQUEST",
        "typed_extension_protocol_options": gate_http2(),
        "circuit_breakers": gate_circuit_breakers(streams),
        "health_checks": gate_health_checks(),
        "outlier_detection": gate_outlier_detection(),
        "load_assignment": {"cluster_name": GATE_CLUSTER, **_endpoints(gate)},
    }


def strip_gate_headers() -> list[dict[str, Any]]:
    """The HCM's early header mutation: drop every client-sent `x-gate-*` header.

    It runs before route matching and before any filter, so a client cannot choose a pool by
    sending `x-gate-cluster`: only the gate's own mutation sets it. (A route's
    `request_headers_to_remove` runs after the filters, too late; a header-mutation filter
    runs after the route was matched and cached on the client's headers.)
    """
    return [
        {
            "name": "envoy.http.early_header_mutation.header_mutation",
            "typed_config": {
                "@type": EARLY_HEADER_MUTATION,
                "mutations": [{"remove_on_match": {"key_matcher": {"prefix": "x-gate-"}}}],
            },
        }
    ]


def mutation_rules() -> dict[str, Any]:
    """The gate may change only the headers it owns; any other mutation is dropped and counted
    (`ext_proc.rejected_header_mutations`). Bodies are unaffected by these rules."""
    return {
        "disallow_all": True,
        "allow_expression": {"regex": f"^({GATE_MUTABLE_HEADERS})$"},
        "disallow_system": True,
        "allow_all_routing": False,
        "allow_envoy": False,
    }


def ext_proc_filter(
    failure_mode_allow: bool, message_timeout_s: float, cluster: str = GATE_CLUSTER
) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}},
            "stat_prefix": "llm_gate",
            # false: gate down → a JSON error at once (nothing bypasses the gate's checks);
            # true: gate down → requests go upstream unchecked and unrouted by the gate.
            "failure_mode_allow": failure_mode_allow,
            # Envoy's default is 200 ms; it must exceed the longest queue wait. The gate sends
            # override_message_timeout (up to max_message_timeout) when a request will queue longer.
            "message_timeout": f"{message_timeout_s:g}s",
            # Below the stream idle timeout (300 s), which a queued request's wait counts towards.
            "max_message_timeout": f"{max(message_timeout_s, MAX_QUEUE_S):g}s",
            "allow_mode_override": True,
            "mutation_rules": mutation_rules(),
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


# The network-level layer beneath the gate's latency breaker. Envoy retries only what never
# reached a model (a connection that failed, a refused stream, a reset before the request was
# sent): a 5xx that a model produced is answered as it is, so one client call never becomes
# several model calls. Endpoints that keep failing are ejected, and a pool cluster holds at
# most so many requests. The gate's breaker acts on slowness, which none of these see.
def retry_policy() -> dict[str, Any]:
    return {
        "retry_on": "connect-failure,refused-stream,reset-before-request",
        "num_retries": 2,
        "retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"},
        "retry_host_predicate": [
            {
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {
                    "@type": TYPE + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                },
            }
        ],
        "host_selection_retry_max_attempts": 3,
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
    return {
        "json_format": {"error": {"message": message, "type": type, "param": None, "code": code}},
        "content_type": "application/json",
    }


def _cel(expression: str) -> dict[str, Any]:
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {"@type": CEL_FILTER, "expression": expression},
        }
    }


REQUEST_ID = "%REQ(X-REQUEST-ID)%"
EXT_PROC_FAILED = "response.code_details.startsWith('ext_proc_error')"
_ID_HEADER = [
    {"header": {"key": "x-request-id", "value": REQUEST_ID}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
]
_RETRY_SOON = [
    {"header": {"key": "retry-after", "value": "1"}},
    {"header": {"key": "x-should-retry", "value": "true"}},
]


def local_reply_mappers() -> list[dict[str, Any]]:
    """Envoy's own error replies in OpenAI's error shape, as the gate's are, with the request id.

    Only replies Envoy made itself are rewritten: a failed ext_proc stream (its details begin
    `ext_proc_error`), upstream failures (a response flag), Envoy's buffer-limit 413 (a body
    without content-length; the gate answers a too-large content-length itself). The gate's
    immediate responses carry none of these.
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
    overflow = (
        "The gate is at its limit of concurrent requests; retry shortly. Request id " + REQUEST_ID + "."
    )
    gate_failed = (
        "The gate could not check this request (%RESPONSE_CODE_DETAILS%). Request id " + REQUEST_ID + "."
    )
    return [
        {
            # The gate cluster's circuit breaker is full: a retryable 503, not an empty 500.
            "filter": _cel(f"{EXT_PROC_FAILED} && response.code_details.contains('overflow')"),
            "status_code": 503,
            "headers_to_add": [*_ID_HEADER, *_RETRY_SOON],
            "body_format_override": _openai_error(overflow, "server_error", "gate_overloaded"),
        },
        {
            "filter": _cel(EXT_PROC_FAILED),
            "headers_to_add": _ID_HEADER,
            "body_format_override": _openai_error(gate_failed, "server_error", "gate_unavailable"),
        },
        {
            "filter": {"response_flag_filter": {}},
            "headers_to_add": _ID_HEADER,
            "body_format_override": _openai_error("%LOCAL_REPLY_BODY%", "upstream_error", "%RESPONSE_FLAGS%"),
        },
        {
            "filter": too_large,
            "headers_to_add": _ID_HEADER,
            "body_format_override": _openai_error(message, "invalid_request_error", "request_too_large"),
        },
    ]


def local_reply_config() -> dict[str, Any]:
    return {"mappers": local_reply_mappers()}


def pool_cluster(name: str, addresses: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": name, **_endpoints(addresses)},
        **pool_protection(),
    }


def pool_route(cluster: str, idle_s: float = UPSTREAM_IDLE_S) -> dict[str, Any]:
    """No total timeout (a streamed answer may run for minutes); an idle timeout instead."""
    return {
        "cluster": cluster,
        "timeout": "0s",
        "idle_timeout": f"{idle_s:g}s",
        "retry_policy": retry_policy(),
    }


def not_routed_reply() -> dict[str, Any]:
    """A gated path the gate did not route: never an unchecked trip to a pool."""
    body = {
        "error": {
            "message": "The gate did not route this request; it was not sent to any model. Retry shortly.",
            "type": "server_error",
            "param": None,
            "code": "not_routed",
        }
    }
    return {"status": 503, "body": {"inline_string": json.dumps(body)}}


def routes(
    pools: list[str],
    default: str,
    *,
    gated: bool = True,
    gated_paths: tuple[str, ...] = GATED_PATHS,
    idle_s: float = UPSTREAM_IDLE_S,
) -> list[dict[str, Any]]:
    """One route per pool on the gate's `x-gate-cluster`; gated paths without it get a JSON 503;
    other paths (e.g. /v1/models, which the gate passes through) go to the default pool."""
    by_header = [
        {
            "name": f"gate-{pool}",
            "match": {
                "prefix": "/",
                "headers": [{"name": "x-gate-cluster", "string_match": {"exact": pool}}],
            },
            "route": pool_route(pool, idle_s),
        }
        for pool in pools
    ]
    unrouted = [
        {
            "name": f"not-routed{path.replace('/', '-')}",
            "match": {"path": path},
            "direct_response": not_routed_reply(),
            "response_headers_to_add": [
                {
                    "header": {"key": "content-type", "value": "application/json"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                },
                *_ID_HEADER,
            ],
        }
        for path in (gated_paths if gated else ())
    ]
    return [
        *by_header,
        *unrouted,
        {"name": "passthrough", "match": {"prefix": "/"}, "route": pool_route(default, idle_s)},
    ]


DOWNSTREAM_CONNECTIONS = "downstream_connections.v3.DownstreamConnectionsConfig"


def overload_manager(max_connections: int = 50_000, max_heap_bytes: int = 2 << 30) -> dict[str, Any]:
    heap = "envoy.resource_monitors.fixed_heap"
    return {
        "refresh_interval": "0.25s",
        "resource_monitors": [
            {
                "name": heap,
                "typed_config": {
                    "@type": TYPE + "envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                    "max_heap_size_bytes": max_heap_bytes,
                },
            },
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": f"{TYPE}envoy.extensions.resource_monitors.{DOWNSTREAM_CONNECTIONS}",
                    "max_active_downstream_connections": max_connections,
                },
            },
        ],
        "actions": [
            {
                "name": "envoy.overload_actions.shrink_heap",
                "triggers": [{"name": heap, "threshold": {"value": 0.90}}],
            },
            {
                "name": "envoy.overload_actions.stop_accepting_requests",
                "triggers": [{"name": heap, "threshold": {"value": 0.95}}],
            },
        ],
    }


def layered_runtime() -> dict[str, Any]:
    """The mutation rules' allow-list regex is over RE2's default size limit of 100 (Istio's
    gateways raise it to 32,768 the same way)."""
    return {
        "layers": [
            {"name": "static", "static_layer": {"re2.max_program_size.error_level": 1024}},
            {"name": "admin", "admin_layer": {}},
        ]
    }


def http_connection_manager(
    route_config: dict[str, Any], http_filters: list[dict[str, Any]], idle_s: float = UPSTREAM_IDLE_S
) -> dict[str, Any]:
    return {
        "@type": HCM,
        "stat_prefix": "llm_gate",
        # Append the peer address to x-forwarded-for, so the gate sees who connected
        # (ratelimit.trusted_hops counts the proxies in front of Envoy).
        "use_remote_address": True,
        # Keep a client's x-request-id (it names the request in every log); make one otherwise.
        "preserve_external_request_id": True,
        "codec_type": "AUTO",
        # Idle, not total: a streamed answer lives as long as tokens flow.
        "stream_idle_timeout": f"{idle_s:g}s",
        "request_headers_timeout": "10s",
        # `x_gate_cluster` must not reach anything that folds `_` into `-`.
        "common_http_protocol_options": {"headers_with_underscores_action": "DROP_HEADER"},
        "early_header_mutation_extensions": strip_gate_headers(),
        "local_reply_config": local_reply_config(),
        "route_config": route_config,
        "http_filters": http_filters,
    }


def bootstrap(
    *,
    listen: tuple[str, int],
    admin: tuple[str, int],
    gate: list[tuple[str, int]],
    pools: dict[str, list[tuple[str, int]]],
    default_pool: str = "primary",
    failure_mode_allow: bool = False,
    message_timeout_s: float = 35.0,
    gate_streams: int = GATE_STREAMS,
    idle_timeout_s: float = UPSTREAM_IDLE_S,
    require_gate_route: bool = True,
) -> dict[str, Any]:
    """`require_gate_route=False` lets unrouted chat requests through to the default pool (a
    processor that never routes, as in benchmarks); fail-open implies it: that is its meaning."""
    gated = bool(gate) and require_gate_route and not failure_mode_allow
    vhost_routes = routes(list(pools), default_pool, gated=gated, idle_s=idle_timeout_s)
    hcm = http_connection_manager(
        {"name": "llm", "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": vhost_routes}]},
        [
            *([ext_proc_filter(failure_mode_allow, message_timeout_s)] if gate else []),
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
        ],
        idle_timeout_s,
    )
    listener = {
        "name": "llm",
        "address": {"socket_address": {"address": listen[0], "port_value": listen[1]}},
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
    }
    clusters = [gate_cluster(gate, gate_streams)] if gate else []
    clusters += [pool_cluster(n, a) for n, a in pools.items()]
    return {
        "admin": {"address": {"socket_address": {"address": admin[0], "port_value": admin[1]}}},
        "overload_manager": overload_manager(),
        "layered_runtime": layered_runtime(),
        "static_resources": {"listeners": [listener], "clusters": clusters},
    }


def include_snippet(gate: list[tuple[str, int]], failure_mode_allow: bool = False) -> dict[str, Any]:
    """Paste `http_filters` (in order) before your router filter and add `clusters[0]`."""
    return {
        "http_filters": [ext_proc_filter(failure_mode_allow, 35.0)],
        "clusters": [gate_cluster(gate)],
        "early_header_mutation_extensions": strip_gate_headers(),
        "local_reply_config": local_reply_config(),
        "routes": routes(["primary", "fallback"], "primary", gated=not failure_mode_allow),
    }


def dump(doc: dict[str, Any], header: str = "") -> str:
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return (host or "127.0.0.1", int(port))


def main(argv: list[str] | None = None) -> int:
    from . import envoy_istio

    parser = argparse.ArgumentParser(prog="llm-gate envoy-config", description=__doc__)
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 10000), help="HOST:PORT for clients")
    parser.add_argument(
        "--admin", type=_address, default=("127.0.0.1", 9901), help="HOST:PORT of Envoy's admin"
    )
    parser.add_argument(
        "--gate", type=_address, action="append", help="gate endpoint HOST:PORT; repeat per worker"
    )
    parser.add_argument(
        "--pool",
        action="append",
        help="NAME=HOST:PORT[,HOST:PORT]; repeat per pool (default primary and fallback)",
    )
    parser.add_argument("--default-pool", default="primary", help="pool of the paths the gate passes through")
    parser.add_argument(
        "--failure-mode-allow", action="store_true", help="gate down: send requests upstream unchecked"
    )
    parser.add_argument(
        "--message-timeout", type=float, default=35.0, help="seconds Envoy waits for each gate answer"
    )
    parser.add_argument(
        "--gate-streams",
        type=int,
        default=GATE_STREAMS,
        help="most concurrent requests (streams) to the gate",
    )
    parser.add_argument("--include", action="store_true", help="write the include snippet instead")
    parser.add_argument(
        "--istio",
        choices=envoy_istio.VARIANTS,
        nargs="?",
        const="istioctl",
        help="write the Istio objects for a gateway installed by istioctl, Helm or Gateway API",
    )
    parser.add_argument("--namespace", default="llm-gate", help="Istio: the gate's namespace")
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
        port = args.gate[0][1] if args.gate else 50051
        text = envoy_istio.render(
            args.istio,
            gate_namespace=args.namespace,
            gate_port=port,
            failure_mode_allow=args.failure_mode_allow,
        )
    else:
        doc = bootstrap(
            listen=args.listen,
            admin=args.admin,
            gate=gate,
            pools=pools,
            default_pool=args.default_pool,
            failure_mode_allow=args.failure_mode_allow,
            message_timeout_s=args.message_timeout,
            gate_streams=args.gate_streams,
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
# Envoy drops client-sent `x-gate-*` headers first; the gate sets `x-gate-cluster` and Envoy
# routes on it. A chat or completions request the gate did not route gets a JSON 503; other
# paths (which the gate passes through, e.g. /v1/models) go to the default pool.
"""

INCLUDE_HEADER = """\
# LLM Gate for your own Envoy: put `http_filters[0]` before the router filter of your HTTP
# connection manager, add `clusters[0]`, and route on the `x-gate-cluster` header as `routes`
# shows (one route per pool cluster; rename the clusters to yours). Set the HCM's
# `early_header_mutation_extensions` (drops client-sent `x-gate-*` before routing) and
# `local_reply_config` (Envoy's own errors as OpenAI-style JSON) to these.
# Keep per_connection_buffer_limit_bytes at or above the gate's validation.max_body_bytes
# (1 MiB by default), and the runtime key re2.max_program_size.error_level at or above 1024
# (the mutation rules' regex; Istio's gateways set 32768). For your pool clusters copy the
# circuit_breakers and outlier_detection of envoy/envoy.yaml: the layer beneath the gate's breaker.
"""
