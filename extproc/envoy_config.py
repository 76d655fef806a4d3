"""Envoy files for the gate: a standalone bootstrap and an include snippet.

`envoy/envoy.yaml` and `envoy/ext_proc-include.yaml` are this module's output with the
default ports (a test keeps them in sync); run `llm-gate envoy-config --help` for others.
The gate's own pieces (its cluster, the ext_proc filter, Envoy's error replies) live in
`extproc.envoy_parts`; the Istio objects come from `extproc.envoy_istio`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from .envoy_parts import (
    BUFFER_LIMIT,
    GATE_CLUSTER,
    GATE_MUTABLE_HEADERS,
    GATE_STREAMS,
    GATED_PATHS,
    HCM,
    HTTP_OPTIONS,
    ID_HEADER,
    MAX_QUEUE_S,
    PASSTHROUGH,
    REQUEST_ID,
    ROUTER,
    TYPE,
    UPSTREAM_IDLE_S,
    discovery,
    endpoints,
    exact_paths_regex,
    ext_proc_filter,
    gate_cluster,
    gate_health_checks,
    gate_http2,
    gate_outlier_detection,
    local_reply_config,
    local_reply_mappers,
    mutation_rules,
    path_normalization,
    strip_gate_headers,
)

__all__ = [
    "BUFFER_LIMIT",
    "GATED_PATHS",
    "GATE_CLUSTER",
    "GATE_MUTABLE_HEADERS",
    "GATE_STREAMS",
    "HCM",
    "HTTP_OPTIONS",
    "ID_HEADER",
    "MAX_QUEUE_S",
    "PASSTHROUGH",
    "REQUEST_ID",
    "ROUTER",
    "TYPE",
    "UPSTREAM_IDLE_S",
    "bootstrap",
    "dump",
    "endpoints",
    "ext_proc_filter",
    "gate_cluster",
    "gate_health_checks",
    "gate_http2",
    "gate_outlier_detection",
    "include_snippet",
    "local_reply_config",
    "local_reply_mappers",
    "main",
    "mutation_rules",
    "not_routed_reply",
    "path_normalization",
    "pool_cluster",
    "pool_protection",
    "pool_route",
    "retry_policy",
    "routes",
    "strip_gate_headers",
]


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
        # A retry avoids the hosts already tried, drawing again while it picks one (the balancer
        # draws at random). With half a pool refusing, before it is ejected, 3 draws again left
        # 1 request in ~500 on refusing hosts for all its tries (a 503); 6 leave 1 in ~30,000.
        "host_selection_retry_max_attempts": 6,
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


def pool_cluster(name: str, addresses: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "name": name,
        **discovery(addresses),
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": name, **endpoints(addresses)},
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
    passthrough: tuple[tuple[str, str], ...] = PASSTHROUGH,
    idle_s: float = UPSTREAM_IDLE_S,
) -> list[dict[str, Any]]:
    """Nothing reaches a pool without the gate.

    The gate's paths go to the pool named by its `x-gate-cluster`; without it they get a JSON
    503 (or, with `gated=False`, go to the default pool). The allow-list (`passthrough`: method
    and exact path) goes to the default pool untouched. Everything else matches no route: a
    JSON 404 (`local_reply_mappers`)."""
    def gate_paths() -> dict[str, Any]:
        return {"safe_regex": {"regex": exact_paths_regex(gated_paths)}}

    by_header = [
        {
            "name": f"gate-{pool}",
            "match": {
                **gate_paths(),
                "headers": [{"name": "x-gate-cluster", "string_match": {"exact": pool}}],
            },
            "route": pool_route(pool, idle_s),
        }
        for pool in pools
    ]
    unrouted: dict[str, Any] = {"name": "not-routed", "match": gate_paths()}
    if gated:
        unrouted["direct_response"] = not_routed_reply()
        unrouted["response_headers_to_add"] = [
            {
                "header": {"key": "content-type", "value": "application/json"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
            *ID_HEADER,
        ]
    else:
        unrouted["route"] = pool_route(default, idle_s)
    allowed = [
        {
            "name": f"passthrough-{method.lower()}{path.replace('/', '-')}",
            "match": {"path": path, "headers": [{"name": ":method", "string_match": {"exact": method}}]},
            "route": pool_route(default, idle_s),
        }
        for method, path in passthrough
    ]
    return [*by_header, unrouted, *allowed]


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
        **path_normalization(),
        # Idle, not total: a streamed answer lives as long as tokens flow.
        "stream_idle_timeout": f"{idle_s:g}s",
        "request_headers_timeout": "10s",
        # `x_gate_cluster` must not reach anything that folds `_` into `-`.
        "common_http_protocol_options": {"headers_with_underscores_action": "DROP_HEADER"},
        "early_header_mutation_extensions": strip_gate_headers(),
        "local_reply_config": local_reply_config(),
        "access_log": [access_log()],
        "route_config": route_config,
        "http_filters": http_filters,
    }


def access_log() -> dict[str, Any]:
    """One JSON line per request on stdout, under the id the gate logs too (never a key)."""
    fields = {
        "request_id": "%REQ(X-REQUEST-ID)%",
        "start_time": "%START_TIME%",
        "method": "%REQ(:METHOD)%",
        "path": "%REQ(:PATH)%",
        "status": "%RESPONSE_CODE%",
        "flags": "%RESPONSE_FLAGS%",
        "duration_ms": "%DURATION%",
        "upstream_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
        "cluster": "%UPSTREAM_CLUSTER%",
        "gate_cache": "%RESP(X-GATE-CACHE)%",
        "bytes_sent": "%BYTES_SENT%",
    }
    return {
        "name": "envoy.access_loggers.stdout",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
            "log_format": {"json_format": fields},
        },
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
        "path_normalization": path_normalization(),
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
        "--gate",
        type=_address,
        action="append",
        help="gate endpoint HOST:PORT; repeat per worker (a hostname, e.g. a headless Service, "
        "is resolved to every address behind it)",
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
    parser.add_argument(
        "--istio-version",
        choices=envoy_istio.ISTIO_VERSIONS,
        default=envoy_istio.SHIPPED_VERSION,
        help="Istio: the oldest minor version the objects must apply on",
    )
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
            version=args.istio_version,
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
# routes on it. A chat or completions request the gate did not route gets a JSON 503. Only
# GET /v1/models and GET /health pass to the default pool without the gate; every other path
# or method (/v1/embeddings, /tokenize, /metrics, ...) is a JSON 404. Paths are normalised
# first (dot segments, repeated slashes; an escaped slash is redirected to its plain form).
"""

INCLUDE_HEADER = """\
# LLM Gate for your own Envoy: put `http_filters[0]` before the router filter of your HTTP
# connection manager, add `clusters[0]`, and route on the `x-gate-cluster` header as `routes`
# shows (one route per pool cluster; rename the clusters to yours), and route nothing else to a
# model server: any other path there skips the gate. Set the HCM's
# `early_header_mutation_extensions` (drops client-sent `x-gate-*` before routing),
# `local_reply_config` (Envoy's own errors as OpenAI-style JSON, a JSON 404 for unrouted
# paths) and the settings in `path_normalization` to these.
# Keep per_connection_buffer_limit_bytes at or above the gate's validation.max_body_bytes
# (1 MiB by default), and the runtime key re2.max_program_size.error_level at or above 1024
# (the mutation rules' regex; Istio's gateways set 32768). For your pool clusters copy the
# circuit_breakers and outlier_detection of envoy/envoy.yaml: the layer beneath the gate's breaker.
"""
