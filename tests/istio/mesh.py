"""An Envoy config shaped like an Istio ingress gateway's, the EnvoyFilter patches merged in
the way istiod merges them, and the mesh's mTLS between the gateway and the gate's sidecar.

The shapes follow what istiod generates for a Gateway + VirtualService (or HTTPRoute):
`outbound|PORT||HOST` clusters, virtual hosts named `HOST:PORT`, route configurations per
gateway server, a listener buffer of 32 KiB, the gateway's http filters before the router.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

from extproc import envoy_config as ec
from extproc import envoy_istio

LOOPBACK = "127.0.0.1"
TYPE = "type.googleapis.com/"
TLS = f"{TYPE}envoy.extensions.transport_sockets.tls.v3"
GATE_SAN = "spiffe://cluster.local/ns/llm-gate/sa/llm-gate"
GATEWAY_SAN = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway"
OTHER_HOST = "other.example"


def make_certs(where: Path) -> dict[str, Path]:
    """A mesh CA and two workload certificates with SPIFFE URI SANs, as istiod issues them."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=where)

    run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/O=cluster.local",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    for name, san in (("gate", GATE_SAN), ("gateway", GATEWAY_SAN)):
        run(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        (where / f"{name}.ext").write_text(
            f"subjectAltName=URI:{san}\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.pem",
        )
    return {n: where / n for n in ("ca.pem", "gate.pem", "gate.key", "gateway.pem", "gateway.key")}


def _tls_context(certs: dict[str, Path], me: str, peer_san: str) -> dict[str, Any]:
    return {
        "tls_certificates": [
            {
                "certificate_chain": {"filename": str(certs[f"{me}.pem"])},
                "private_key": {"filename": str(certs[f"{me}.key"])},
            }
        ],
        "validation_context": {
            "trusted_ca": {"filename": str(certs["ca.pem"])},
            "match_typed_subject_alt_names": [{"san_type": "URI", "matcher": {"exact": peer_san}}],
        },
    }


def _static(name: str, port: int, **extra: Any) -> dict[str, Any]:
    endpoint = {"endpoint": {"address": {"socket_address": {"address": LOOPBACK, "port_value": port}}}}
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "per_connection_buffer_limit_bytes": 32768,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint]}]},
        **extra,
    }


def _match(path: tuple[str, str] | None, headers: list[tuple[str, str]]) -> dict[str, Any]:
    match: dict[str, Any] = {"prefix": "/"}
    if path is not None:
        kind, value = path
        match = {"path": value} if kind == "exact" else {"prefix": value}
    if headers:
        match["headers"] = [{"name": k, "string_match": {"exact": v}} for k, v in headers]
    return match


def translate_routes(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Envoy routes istiod makes of the shipped VirtualService or HTTPRoute (the subset used)."""
    routes: list[dict[str, Any]] = []
    for doc in docs:
        if doc["kind"] == "VirtualService":
            for http in doc["spec"]["http"]:
                for m in http.get("match") or [{}]:
                    uri = m.get("uri")
                    path = ("exact", uri["exact"]) if uri else None
                    headers = [(k, v["exact"]) for k, v in m.get("headers", {}).items()]
                    if "method" in m:
                        headers.append((":method", m["method"]["exact"]))
                    route: dict[str, Any] = {"name": http["name"], "match": _match(path, headers)}
                    if "directResponse" in http:
                        d = http["directResponse"]
                        route["direct_response"] = {
                            "status": d["status"],
                            "body": {"inline_string": d["body"]["string"]},
                        }
                    else:
                        dest = http["route"][0]["destination"]
                        route["route"] = {
                            "cluster": f"outbound|{dest['port']['number']}||{dest['host']}",
                            "timeout": "0s",
                            "retry_policy": {
                                "retry_on": http["retries"]["retryOn"],
                                "num_retries": http["retries"]["attempts"],
                            },
                        }
                    routes.append(route)
        if doc["kind"] == "HTTPRoute":
            ns = doc["metadata"]["namespace"]
            for rule in doc["spec"]["rules"]:
                ref = rule["backendRefs"][0]
                cluster = f"outbound|{ref['port']}||{ref['name']}.{ns}.svc.cluster.local"
                for m in rule["matches"]:
                    p = m.get("path")
                    path = ("exact" if p["type"] == "Exact" else "prefix", p["value"]) if p else None
                    headers = [(h["name"], h["value"]) for h in m.get("headers", [])]
                    if "method" in m:
                        headers.append((":method", m["method"]))
                    route = {"cluster": cluster, "timeout": "0s"}
                    routes.append({"match": _match(path, headers), "route": route})
    return routes


def gateway_bootstrap(
    docs: list[dict[str, Any]],
    *,
    listen: int,
    admin: int,
    sidecar: int,
    gate: int,
    pools: dict[str, int],
    certs: dict[str, Path],
) -> tuple[dict[str, Any], str]:
    """The gateway (and, on `sidecar`, the gate pod's mTLS sidecar) before any EnvoyFilter.

    Returns the bootstrap and the `namespace/name` of the Istio gateway its routes belong to."""
    gate_cluster = envoy_istio.outbound_cluster("llm-gate", 50051)
    other_routes = [
        {"match": {"prefix": "/"}, "route": {"cluster": "outbound|80||other.apps.svc.cluster.local"}}
    ]
    route_config = {
        "name": "https.443.https-llm.llm-gateway.istio-system",
        "virtual_hosts": [
            {
                "name": f"{envoy_istio.LLM_HOST}:443",
                "domains": [envoy_istio.LLM_HOST, f"{envoy_istio.LLM_HOST}:*"],
                "routes": translate_routes(docs),
            },
            {"name": f"{OTHER_HOST}:443", "domains": [OTHER_HOST, f"{OTHER_HOST}:*"], "routes": other_routes},
        ],
    }
    hcm = {
        "@type": ec.HCM,
        "stat_prefix": "outbound_0.0.0.0_8443",
        "use_remote_address": True,
        "route_config": route_config,
        "http_filters": [
            {
                "name": "envoy.filters.http.cors",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"},
            },
            {
                "name": "envoy.filters.http.fault",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"
                },
            },
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ec.ROUTER}},
        ],
    }
    gateway_listener = {
        "name": "0.0.0.0_8443",
        "address": {"socket_address": {"address": LOOPBACK, "port_value": listen}},
        "per_connection_buffer_limit_bytes": 32768,
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
    }
    # The gate pod's sidecar: mTLS in (the gateway's identity only), plaintext to the gate.
    sidecar_listener = {
        "name": "virtualInbound",
        "address": {"socket_address": {"address": LOOPBACK, "port_value": sidecar}},
        "filter_chains": [
            {
                "transport_socket": {
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": f"{TLS}.DownstreamTlsContext",
                        "require_client_certificate": True,
                        "common_tls_context": _tls_context(certs, "gate", GATEWAY_SAN),
                    },
                },
                "filters": [
                    {
                        "name": "envoy.filters.network.tcp_proxy",
                        "typed_config": {
                            "@type": f"{TYPE}envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                            "stat_prefix": "inbound_50051",
                            "cluster": "inbound|50051||",
                        },
                    }
                ],
            }
        ],
    }
    upstream_tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": f"{TLS}.UpstreamTlsContext",
            "sni": "outbound_.50051_._.llm-gate.llm-gate.svc.cluster.local",
            "common_tls_context": _tls_context(certs, "gateway", GATE_SAN),
        },
    }
    h2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": ec.HTTP_OPTIONS,
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    clusters = [
        _static(gate_cluster, sidecar, transport_socket=upstream_tls, typed_extension_protocol_options=h2),
        _static("inbound|50051||", gate, typed_extension_protocol_options=h2),
        *(_static(f"outbound|8000||{envoy_istio.pool_host(pool)}", port) for pool, port in pools.items()),
        _static("outbound|80||other.apps.svc.cluster.local", 1),  # an application that is down
    ]
    doc = {
        "admin": {"address": {"socket_address": {"address": LOOPBACK, "port_value": admin}}},
        # As in istiod's bootstrap: regexes up to 32,768 in program size.
        "layered_runtime": {
            "layers": [{"name": "static", "static_layer": {"re2.max_program_size.error_level": 32768}}]
        },
        "static_resources": {"listeners": [gateway_listener, sidecar_listener], "clusters": clusters},
    }
    return doc, "istio-system/llm-gateway"


def _merge(into: dict[str, Any], value: dict[str, Any]) -> None:
    """Protobuf merge: messages merge field by field, repeated fields append, scalars replace."""
    for key, new in value.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            _merge(old, new)
        elif isinstance(old, list) and isinstance(new, list):
            old.extend(copy.deepcopy(new))
        else:
            into[key] = copy.deepcopy(new)


def _hcms(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        f
        for listener in doc["static_resources"]["listeners"]
        for chain in listener["filter_chains"]
        for f in chain["filters"]
        if f["name"] == "envoy.filters.network.http_connection_manager"
    ]


def apply_patches(doc: dict[str, Any], envoy_filter: dict[str, Any], gateway: str) -> dict[str, Any]:
    """Merge an EnvoyFilter's configPatches (the operations and matches it uses) into `doc`."""
    doc = copy.deepcopy(doc)
    for patch in envoy_filter["spec"]["configPatches"]:
        kind, match = patch["applyTo"], patch["match"]
        op, value = patch["patch"]["operation"], patch["patch"]["value"]
        assert match["context"] == "GATEWAY"
        if kind == "LISTENER":
            assert op == "MERGE"
            for listener in doc["static_resources"]["listeners"]:
                if _hcms({"static_resources": {"listeners": [listener]}}):
                    _merge(listener, value)
        elif kind == "NETWORK_FILTER":
            assert op == "MERGE"
            assert (
                match["listener"]["filterChain"]["filter"]["name"]
                == "envoy.filters.network.http_connection_manager"
            )
            for hcm in _hcms(doc):
                _merge(hcm, value)
        elif kind == "HTTP_FILTER":
            assert op == "INSERT_BEFORE"
            before = match["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            for hcm in _hcms(doc):
                filters = hcm["typed_config"]["http_filters"]
                at = next(i for i, f in enumerate(filters) if f["name"] == before)
                filters.insert(at, copy.deepcopy(value))
        elif kind == "VIRTUAL_HOST":
            assert op == "MERGE"
            want = match["routeConfiguration"]
            if want.get("gateway", gateway) != gateway:
                continue
            for hcm in _hcms(doc):
                for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
                    if want["vhost"]["name"] == vhost["name"]:
                        _merge(vhost, value)
        elif kind == "CLUSTER":
            assert op == "MERGE"
            want = match["cluster"]
            for cluster in doc["static_resources"]["clusters"]:
                parts = cluster["name"].split("|")
                if len(parts) == 4 and parts[3] == want["service"] and int(parts[1]) == want["portNumber"]:
                    _merge(cluster, value)
        else:
            raise AssertionError(f"patch kind {kind} is not modelled here")
    return doc
