"""The gate on an Istio ingress gateway: the EnvoyFilter, Gateway, routes and DestinationRules.

Three variants differ only in how they find the gateway: istioctl's default gateway
(`istio: ingressgateway`), the Helm chart's (`istio: ingress`) and a Gateway API gateway
(`targetRefs`). In all of them:

- the gate is reached through the mesh's own outbound cluster for its Service, so the
  sidecar's mTLS, per-pod endpoints and the DestinationRule apply; the EnvoyFilter adds
  gRPC health checks and HTTP/2 keepalive to that cluster;
- on a shared gateway (istioctl, Helm) the ext_proc filter is inserted disabled and enabled
  only on the LLM host's virtual host, so the gateway's other applications never pass
  through the gate; a Gateway API gateway is a deployment of its own, gated as a whole;
- client-sent `x-gate-*` headers are dropped before routing, and the listeners buffer 1 MiB
  instead of Istio's 32 KiB (both gateway-wide, and harmless for other hosts);
- Envoy's own error replies become OpenAI-style JSON only for requests to the LLM host;
- a pool is chosen only by the `x-gate-cluster` the gate set, and a chat or completions
  request the gate did not route never falls through to a pool; besides the gate's paths only
  the allow-list (`GET /v1/models`, `GET /health`) reaches a pool, and every other path of the
  LLM host is a JSON 404; paths are normalised first.

Istio versions differ in what they accept, so the objects are rendered for a minor version
(`ISTIO_VERSIONS`): `retryOn: reset-before-request` only from 1.23 (the shipped files are
rendered for 1.22 and apply unchanged on 1.22-1.25; render for 1.23+ to retry resets too).
The virtual host is matched by its name (`HOST:PORT`), which every version accepts
(`vhost.domainName` exists only from 1.25).
"""

from __future__ import annotations

from typing import Any

import yaml

from . import envoy_config as ec

VARIANTS = ("istioctl", "helm", "gateway-api")
ISTIO_VERSIONS = ("1.22", "1.23", "1.24", "1.25")
SHIPPED_VERSION = "1.22"  # the oldest supported: what it accepts, every later version accepts
LLM_HOST = "llm.example.internal"
LLM_NAMESPACE = "llm"
GATEWAY_NAME = "llm-gateway"
GATEWAY_NAMESPACE = "istio-system"  # istioctl and Helm variants; Gateway API uses LLM_NAMESPACE
TLS_SECRET = "llm-example-tls"
POOLS = {"primary": "vllm-primary", "fallback": "vllm-fallback"}  # gate cluster → Service
POOL_PORT = 8000
GATEWAY_PORT = 443
SELECTORS = {"istioctl": {"istio": "ingressgateway"}, "helm": {"istio": "ingress"}}
EXT_PROC_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"


def gate_service(namespace: str) -> str:
    return f"llm-gate.{namespace}.svc.cluster.local"


def outbound_cluster(namespace: str, port: int) -> str:
    """The cluster Istio builds for a Service port: mTLS, EDS with one endpoint per pod."""
    return f"outbound|{port}||{gate_service(namespace)}"


def pool_host(pool: str) -> str:
    return f"{POOLS[pool]}.{LLM_NAMESPACE}.svc.cluster.local"


def scoped_local_reply() -> dict[str, Any]:
    """The bootstrap's error-body mappers, each applied only to requests for the LLM host."""
    host = {"header_filter": {"header": {"name": ":authority", "string_match": {"prefix": LLM_HOST}}}}
    mappers = []
    for mapper in ec.local_reply_mappers():
        mappers.append({**mapper, "filter": {"and_filter": {"filters": [host, mapper["filter"]]}}})
    return {"mappers": mappers}


def _minor(version: str) -> int:
    if version not in ISTIO_VERSIONS:
        raise ValueError(f"unsupported Istio version {version!r}; one of {', '.join(ISTIO_VERSIONS)}")
    return int(version.split(".")[1])


def retry_on(version: str) -> str:
    """Only what never reached a model; `reset-before-request` is known to Istio from 1.23."""
    policies = ["connect-failure", "refused-stream"]
    if _minor(version) >= 23:
        policies.append("reset-before-request")
    return ",".join(policies)


def config_patches(
    namespace: str, port: int, failure_mode_allow: bool, gateway: str | None
) -> list[dict[str, Any]]:
    hcm_match = {
        "context": "GATEWAY",
        "listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}},
    }
    router_match = {
        "context": "GATEWAY",
        "listener": {
            "filterChain": {
                "filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": "envoy.filters.http.router"},
                }
            }
        },
    }
    ext_proc = ec.ext_proc_filter(failure_mode_allow, 35.0, cluster=outbound_cluster(namespace, port))
    vhost: dict[str, Any] = {"vhost": {"name": f"{LLM_HOST}:{GATEWAY_PORT}"}}
    if gateway:
        vhost["gateway"] = gateway
    enable = {
        ext_proc["name"]: {"@type": FILTER_CONFIG, "config": {"@type": EXT_PROC_PER_ROUTE, "overrides": {}}}
    }
    # A shared gateway (istioctl, Helm): the filter is off by default and on for the LLM host's
    # virtual host. A Gateway API gateway is a deployment of its own: the filter is on for it all.
    insert = {
        "applyTo": "HTTP_FILTER",
        "match": router_match,
        "patch": {"operation": "INSERT_BEFORE", "value": {**ext_proc, "disabled": bool(gateway)}},
    }
    on_vhost = {
        "applyTo": "VIRTUAL_HOST",
        "match": {"context": "GATEWAY", "routeConfiguration": vhost},
        "patch": {"operation": "MERGE", "value": {"typed_per_filter_config": enable}},
    }
    gate_filter = [insert, on_vhost] if gateway else [insert]
    cluster_value = {
        "typed_extension_protocol_options": ec.gate_http2(),
        "health_checks": ec.gate_health_checks(),
    }
    return [
        {
            # Istio's listeners buffer 32 KiB; the gate sees whole bodies up to 1 MiB.
            "applyTo": "LISTENER",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "MERGE", "value": {"per_connection_buffer_limit_bytes": ec.BUFFER_LIMIT}},
        },
        {
            "applyTo": "NETWORK_FILTER",
            "match": hcm_match,
            "patch": {
                "operation": "MERGE",
                "value": {
                    "typed_config": {
                        "@type": ec.HCM,
                        **ec.path_normalization(),
                        "early_header_mutation_extensions": ec.strip_gate_headers(),
                        "local_reply_config": scoped_local_reply(),
                    }
                },
            },
        },
        *gate_filter,
        {
            "applyTo": "CLUSTER",
            "match": {
                "context": "GATEWAY",
                "cluster": {"service": gate_service(namespace), "portNumber": port},
            },
            "patch": {"operation": "MERGE", "value": cluster_value},
        },
    ]


def envoy_filter(variant: str, namespace: str, port: int, failure_mode_allow: bool) -> dict[str, Any]:
    spec: dict[str, Any]
    if variant == "gateway-api":
        target = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": GATEWAY_NAME}
        spec = {"targetRefs": [target]}
        where, gateway = LLM_NAMESPACE, None
    else:
        spec = {"workloadSelector": {"labels": SELECTORS[variant]}}
        where, gateway = GATEWAY_NAMESPACE, f"{GATEWAY_NAMESPACE}/{GATEWAY_NAME}"
    spec["configPatches"] = config_patches(namespace, port, failure_mode_allow, gateway)
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "llm-gate", "namespace": where},
        "spec": spec,
    }


def istio_gateway(variant: str) -> dict[str, Any]:
    server = {
        "port": {"number": GATEWAY_PORT, "name": "https-llm", "protocol": "HTTPS"},
        "hosts": [f"{LLM_NAMESPACE}/{LLM_HOST}"],
        "tls": {"mode": "SIMPLE", "credentialName": TLS_SECRET},
    }
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY_NAME, "namespace": GATEWAY_NAMESPACE},
        "spec": {"selector": SELECTORS[variant], "servers": [server]},
    }


def k8s_gateway() -> dict[str, Any]:
    listener = {
        "name": "https-llm",
        "hostname": LLM_HOST,
        "port": GATEWAY_PORT,
        "protocol": "HTTPS",
        "tls": {"mode": "Terminate", "certificateRefs": [{"name": TLS_SECRET}]},
        "allowedRoutes": {"namespaces": {"from": "Same"}},
    }
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY_NAME, "namespace": LLM_NAMESPACE},
        "spec": {"gatewayClassName": "istio", "listeners": [listener]},
    }


def not_routed_response() -> dict[str, Any]:
    reply = ec.not_routed_reply()
    return {"status": reply["status"], "body": {"string": reply["body"]["inline_string"]}}


def virtual_service(version: str) -> dict[str, Any]:
    """The gate's paths by its header; without it a JSON 503; the allow-list → primary; any
    other path matches nothing (Envoy's 404, made JSON for the LLM host)."""
    # No route timeout (Istio's default is none): a streamed answer may run for minutes.
    retries = {"attempts": 2, "retryOn": retry_on(version)}
    http: list[dict[str, Any]] = [
        {
            "name": f"gate-{pool}",
            "match": [
                {"uri": {"exact": path}, "headers": {"x-gate-cluster": {"exact": pool}}}
                for path in ec.GATED_PATHS
            ],
            "route": [{"destination": {"host": pool_host(pool), "port": {"number": POOL_PORT}}}],
            "retries": retries,
        }
        for pool in POOLS
    ]
    http.append(
        {
            "name": "not-routed",
            "match": [{"uri": {"exact": path}} for path in ec.GATED_PATHS],
            "directResponse": not_routed_response(),
            "headers": {"response": {"set": {"content-type": "application/json"}}},
        }
    )
    http.append(
        {
            "name": "passthrough",
            "match": [
                {"uri": {"exact": path}, "method": {"exact": method}} for method, path in ec.PASSTHROUGH
            ],
            "route": [{"destination": {"host": pool_host("primary"), "port": {"number": POOL_PORT}}}],
            "retries": retries,
        }
    )
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "llm", "namespace": LLM_NAMESPACE},
        "spec": {"hosts": [LLM_HOST], "gateways": [f"{GATEWAY_NAMESPACE}/{GATEWAY_NAME}"], "http": http},
    }


def http_route() -> dict[str, Any]:
    """Gateway API has no direct response: a gated path the gate did not route, like any path
    outside the allow-list, matches no rule (Envoy's 404, as JSON)."""

    def backend(pool: str) -> list[dict[str, Any]]:
        return [{"name": POOLS[pool], "port": POOL_PORT}]

    rules: list[dict[str, Any]] = [
        {
            "matches": [
                {
                    "path": {"type": "Exact", "value": path},
                    "headers": [{"type": "Exact", "name": "x-gate-cluster", "value": pool}],
                }
                for path in ec.GATED_PATHS
            ],
            "backendRefs": backend(pool),
        }
        for pool in POOLS
    ]
    rules.append(
        {
            "matches": [
                {"path": {"type": "Exact", "value": path}, "method": method}
                for method, path in ec.PASSTHROUGH
            ],
            "backendRefs": backend("primary"),
        }
    )
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm", "namespace": LLM_NAMESPACE},
        "spec": {"parentRefs": [{"name": GATEWAY_NAME}], "hostnames": [LLM_HOST], "rules": rules},
    }


def destination_rules(namespace: str, port: int) -> list[dict[str, Any]]:
    protection = ec.pool_protection()
    outlier = protection["outlier_detection"]
    limits = protection["circuit_breakers"]["thresholds"][0]
    pools = [
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": POOLS[pool], "namespace": LLM_NAMESPACE},
            "spec": {
                "host": pool_host(pool),
                "trafficPolicy": {
                    "loadBalancer": {"simple": "LEAST_REQUEST"},
                    "connectionPool": {
                        "tcp": {"maxConnections": limits["max_connections"]},
                        "http": {
                            "http1MaxPendingRequests": limits["max_pending_requests"],
                            "http2MaxRequests": limits["max_requests"],
                        },
                    },
                    "outlierDetection": {
                        "consecutive5xxErrors": outlier["consecutive_5xx"],
                        "consecutiveGatewayErrors": outlier["consecutive_gateway_failure"],
                        "interval": outlier["interval"],
                        "baseEjectionTime": outlier["base_ejection_time"],
                        "maxEjectionPercent": outlier["max_ejection_percent"],
                    },
                },
            },
        }
        for pool in POOLS
    ]
    gate_outlier = ec.gate_outlier_detection()
    gate = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "llm-gate", "namespace": namespace},
        "spec": {
            "host": gate_service(namespace),
            "trafficPolicy": {
                "tls": {"mode": "ISTIO_MUTUAL"},
                "loadBalancer": {"simple": "LEAST_REQUEST"},
                "connectionPool": {
                    "tcp": {"connectTimeout": "0.25s"},
                    "http": {
                        "h2UpgradePolicy": "UPGRADE",
                        "http1MaxPendingRequests": ec.GATE_STREAMS,
                        "http2MaxRequests": ec.GATE_STREAMS,
                    },
                },
                "outlierDetection": {
                    "splitExternalLocalOriginErrors": True,
                    "consecutiveLocalOriginFailures": gate_outlier["consecutive_local_origin_failure"],
                    "consecutiveGatewayErrors": gate_outlier["consecutive_gateway_failure"],
                    "interval": gate_outlier["interval"],
                    "baseEjectionTime": gate_outlier["base_ejection_time"],
                    "maxEjectionPercent": gate_outlier["max_ejection_percent"],
                },
            },
        },
    }
    return [gate, *pools]


def documents(
    variant: str,
    namespace: str = "llm-gate",
    port: int = 50051,
    failure_mode_allow: bool = False,
    version: str = SHIPPED_VERSION,
) -> list[dict[str, Any]]:
    _minor(version)
    if variant not in VARIANTS:
        raise ValueError(f"unknown Istio variant {variant!r}; one of {', '.join(VARIANTS)}")
    if variant == "gateway-api":
        routing = [k8s_gateway(), http_route()]
    else:
        routing = [istio_gateway(variant), virtual_service(version)]
    return [
        envoy_filter(variant, namespace, port, failure_mode_allow),
        *routing,
        *destination_rules(namespace, port),
    ]


HEADER = """\
# LLM Gate on an Istio ingress gateway ({what}), Istio {version} and later.
# Generated by `llm-gate envoy-config --istio {variant} --istio-version {version}`; edit the
# flags, not this file.
# The gate: Service `llm-gate` (namespace `{namespace}`, gRPC port {port}), reached over the
# mesh's mTLS through its outbound cluster. The LLM host `{host}` → vLLM Services
# `vllm-primary` and `vllm-fallback` (namespace `llm`, port 8000); replace the host, the TLS
# secret and the Services with yours, keeping each `x-gate-cluster` value equal to the pool's
# `cluster` in the gate's config (routing.pools.NAME.cluster). {scope}
# Only the gate's paths and GET /v1/models, GET /health reach a pool; other paths get a JSON
# 404. The gate's namespace needs sidecar injection (the DestinationRule uses the mesh's mTLS).
"""
SCOPE = {
    "istioctl": "Only the LLM host is gated.",
    "helm": "Only the LLM host is gated.",
    "gateway-api": "The Gateway is the LLM's own: all of it is gated.",
}
WHAT = {
    "istioctl": "installed by istioctl: pods labelled istio=ingressgateway",
    "helm": "installed by the istio/gateway Helm chart: pods labelled istio=ingress",
    "gateway-api": "a Gateway API Gateway of class istio, selected by targetRefs",
}


def render(
    variant: str,
    *,
    gate_namespace: str = "llm-gate",
    gate_port: int = 50051,
    failure_mode_allow: bool = False,
    version: str = SHIPPED_VERSION,
) -> str:
    docs = documents(variant, gate_namespace, gate_port, failure_mode_allow, version)
    header = HEADER.format(
        version=version,
        what=WHAT[variant],
        scope=SCOPE[variant],
        variant=variant,
        namespace=gate_namespace,
        port=gate_port,
        host=LLM_HOST,
    )
    return header + yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)


FILES = {
    "istioctl": "istio/envoyfilter.yaml",
    "helm": "istio/envoyfilter-helm.yaml",
    "gateway-api": "istio/gateway-api.yaml",
}
