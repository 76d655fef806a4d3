"""Every shipped Istio object against Istio's CRD schemas, and the variants against each other.

`istio_crd_schemas.json` holds the openAPIV3Schema of the four kinds we ship, extracted from
istio/api (its provenance field names the commit). Validation is strict, as
`kubectl apply --validate=strict` is: a field the schema does not know is an error, not
something the API server silently prunes. The Gateway API objects are checked the same way
against `gateway_api_crd_schemas.json` (kubernetes-sigs/gateway-api, standard channel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from extproc import envoy_istio

REPO = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).parent
SCHEMAS = {
    **json.loads((HERE / "istio_crd_schemas.json").read_text())["schemas"],
    **json.loads((HERE / "gateway_api_crd_schemas.json").read_text())["schemas"],
}


def strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def shipped(variant: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / envoy_istio.FILES[variant]).read_text()) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("variant", envoy_istio.VARIANTS)
def test_every_shipped_object_passes_its_crd_schema(variant: str) -> None:
    checked = 0
    for doc in shipped(variant):
        group, _, version = doc["apiVersion"].partition("/")
        schema = strict(SCHEMAS[f"{group}/{version}/{doc['kind']}"])
        body = {k: v for k, v in doc.items() if k in ("spec", "status")}
        jsonschema.validate(body, schema)
        checked += 1
    assert checked == len(shipped(variant)) >= 4


def test_a_typo_in_an_object_is_caught() -> None:
    doc = shipped("istioctl")[0]
    doc["spec"]["configPatches"][0]["match"]["contxt"] = "GATEWAY"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"spec": doc["spec"]}, strict(SCHEMAS["networking.istio.io/v1alpha3/EnvoyFilter"])
        )


@pytest.mark.parametrize(
    ("variant", "labels"), [("istioctl", {"istio": "ingressgateway"}), ("helm", {"istio": "ingress"})]
)
def test_each_selector_variant_selects_the_gateway_it_ships(variant: str, labels: dict[str, str]) -> None:
    docs = shipped(variant)
    (envoy_filter,) = by_kind(docs, "EnvoyFilter")
    (gateway,) = by_kind(docs, "Gateway")
    (service,) = by_kind(docs, "VirtualService")
    assert envoy_filter["spec"]["workloadSelector"]["labels"] == labels == gateway["spec"]["selector"]
    name = f"{gateway['metadata']['namespace']}/{gateway['metadata']['name']}"
    assert service["spec"]["gateways"] == [name]
    vhost_patches = [p for p in envoy_filter["spec"]["configPatches"] if p["applyTo"] == "VIRTUAL_HOST"]
    assert [p["match"]["routeConfiguration"]["gateway"] for p in vhost_patches] == [name]
    assert vhost_patches[0]["match"]["routeConfiguration"]["vhost"]["domainName"] in service["spec"]["hosts"]
    # The root namespace's EnvoyFilter reaches gateways in every namespace.
    assert envoy_filter["metadata"]["namespace"] == "istio-system"


def test_gateway_api_variant_targets_the_gateway_it_ships() -> None:
    docs = shipped("gateway-api")
    (envoy_filter,) = by_kind(docs, "EnvoyFilter")
    (gateway,) = by_kind(docs, "Gateway")
    (route,) = by_kind(docs, "HTTPRoute")
    assert gateway["spec"]["gatewayClassName"] == "istio"
    (target,) = envoy_filter["spec"]["targetRefs"]
    assert (target["group"], target["kind"], target["name"]) == (
        "gateway.networking.k8s.io",
        "Gateway",
        gateway["metadata"]["name"],
    )
    assert (
        envoy_filter["metadata"]["namespace"] == gateway["metadata"]["namespace"]
    )  # no cross-namespace refs
    assert route["spec"]["parentRefs"] == [{"name": gateway["metadata"]["name"]}]
    assert route["spec"]["hostnames"] == [gateway["spec"]["listeners"][0]["hostname"]]


@pytest.mark.parametrize("variant", envoy_istio.VARIANTS)
def test_the_gate_is_reached_through_the_mesh_over_mtls(variant: str) -> None:
    docs = shipped(variant)
    (envoy_filter,) = by_kind(docs, "EnvoyFilter")
    patches = envoy_filter["spec"]["configPatches"]
    assert not [p for p in patches if p["patch"]["operation"] == "ADD"], "no cluster of our own"
    (ext_proc,) = [p["patch"]["value"] for p in patches if p["applyTo"] == "HTTP_FILTER"]
    cluster = ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    assert cluster == "outbound|50051||llm-gate.llm-gate.svc.cluster.local"
    # On a shared gateway, enabled only on the LLM host's virtual host.
    assert ext_proc["disabled"] is (variant != "gateway-api")
    (gate_rule,) = [d for d in by_kind(docs, "DestinationRule") if d["metadata"]["name"] == "llm-gate"]
    assert gate_rule["spec"]["host"] == "llm-gate.llm-gate.svc.cluster.local"
    assert gate_rule["spec"]["trafficPolicy"]["tls"] == {"mode": "ISTIO_MUTUAL"}
    (cluster_patch,) = [p for p in patches if p["applyTo"] == "CLUSTER"]
    assert cluster_patch["patch"]["value"]["health_checks"][0]["grpc_health_check"] == {}
