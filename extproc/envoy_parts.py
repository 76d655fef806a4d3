"""The gate's side of Envoy: its cluster, the ext_proc filter, and Envoy's own error replies.

Shared by the standalone bootstrap and include snippet (`extproc.envoy_config`) and by the
Istio objects (`extproc.envoy_istio`).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

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
GATED_PATHS = ("/v1/chat/completions", "/v1/completions")  # the gate's routing.handled_paths
# The only other requests that reach a pool, untouched by the gate (routing.passthrough):
# everything else a model server offers (/v1/embeddings, /v1/responses, /tokenize, /metrics,
# ...) would skip the gate's limits, admission and cache, so Envoy answers it with a JSON 404.
PASSTHROUGH = (("GET", "/v1/models"), ("GET", "/health"))
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


def endpoints(addresses: list[tuple[str, int]]) -> dict[str, Any]:
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


def discovery(addresses: list[tuple[str, int]]) -> dict[str, Any]:
    """STATIC for IP addresses; STRICT_DNS when a host is a name, so a headless Service's name
    yields one endpoint per pod, re-resolved as pods come and go."""
    if all(_is_ip(host) for host, _ in addresses):
        return {"type": "STATIC"}
    return {"type": "STRICT_DNS", "dns_refresh_rate": "5s", "respect_dns_ttl": True}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
        **discovery(gate),
        "connect_timeout": "0.25s",
        "lb_policy": "LEAST_REQUEST",
        "typed_extension_protocol_options": gate_http2(),
        "circuit_breakers": gate_circuit_breakers(streams),
        "health_checks": gate_health_checks(),
        "outlier_detection": gate_outlier_detection(),
        "load_assignment": {"cluster_name": GATE_CLUSTER, **endpoints(gate)},
    }


def path_normalization() -> dict[str, Any]:
    """HTTP connection manager settings: the path every filter and route sees is canonical.

    `/v1/./chat/completions` and `//v1/chat/completions` become `/v1/chat/completions`; a path
    with an escaped slash (`%2F`, `%5C`) is answered with a redirect to its unescaped form, so
    the gate and the routes only ever match one spelling of a path. (Routes match exact paths
    anyway: any other spelling finds no route and gets the JSON 404.)
    """
    return {
        "normalize_path": True,
        "merge_slashes": True,
        "path_with_escaped_slashes_action": "UNESCAPE_AND_REDIRECT",
    }


def exact_paths_regex(paths: tuple[str, ...]) -> str:
    """A RE2 regex that matches exactly these paths (Envoy matches it against the whole path)."""
    return "|".join(re.escape(p) for p in paths)


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
ID_HEADER = [
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
    served = ", ".join(f"POST {p}" for p in GATED_PATHS) + " and " + ", ".join(
        f"{m} {p}" for m, p in PASSTHROUGH
    )
    no_route = f"This endpoint is not served here; the gateway serves {served}. Request id {REQUEST_ID}."
    bad_path = (
        "The request path could not be normalised (an escaped control character, a fragment, or"
        " another form without one meaning); send the plain path, e.g. /v1/chat/completions."
    )
    gate_failed = (
        "The gate could not check this request (%RESPONSE_CODE_DETAILS%). Request id " + REQUEST_ID + "."
    )
    return [
        {
            # The gate cluster's circuit breaker is full: a retryable 503, not an empty 500.
            "filter": _cel(f"{EXT_PROC_FAILED} && response.code_details.contains('overflow')"),
            "status_code": 503,
            "headers_to_add": [*ID_HEADER, *_RETRY_SOON],
            "body_format_override": _openai_error(overflow, "server_error", "gate_overloaded"),
        },
        {
            "filter": _cel(EXT_PROC_FAILED),
            "headers_to_add": ID_HEADER,
            "body_format_override": _openai_error(gate_failed, "server_error", "gate_unavailable"),
        },
        {
            # A path with no single meaning (an escaped NUL, a fragment): refused before routing.
            "filter": _cel("response.code_details == 'path_normalization_failed' && response.code == 400"),
            "headers_to_add": [*ID_HEADER, {"header": {"key": "x-should-retry", "value": "false"}}],
            "body_format_override": _openai_error(bad_path, "invalid_request_error", "invalid_path"),
        },
        {
            # No route: a path (or method) outside the gate's paths and the allow-list.
            "filter": {"response_flag_filter": {"flags": ["NR"]}},
            "headers_to_add": [*ID_HEADER, {"header": {"key": "x-should-retry", "value": "false"}}],
            "body_format_override": _openai_error(no_route, "invalid_request_error", "not_found"),
        },
        {
            "filter": {"response_flag_filter": {}},
            "headers_to_add": ID_HEADER,
            "body_format_override": _openai_error("%LOCAL_REPLY_BODY%", "upstream_error", "%RESPONSE_FLAGS%"),
        },
        {
            "filter": too_large,
            "headers_to_add": [*ID_HEADER, {"header": {"key": "x-should-retry", "value": "false"}}],
            "body_format_override": _openai_error(message, "invalid_request_error", "request_too_large"),
        },
    ]


def local_reply_config() -> dict[str, Any]:
    return {"mappers": local_reply_mappers()}
