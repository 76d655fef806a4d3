"""Every shipped Istio object against Istio's CRD schemas, and the variants against each other.

`crds/istio-MINOR.json` hold the openAPIV3Schema of the kinds we ship for each supported Istio
minor version, extracted from istio/api by `python -m tests.istio.extract_crds` (each file's
provenance names the tag). Every variant, rendered for each version, is validated against
that version's schemas and every later one's (an upgrade must not break it). Validation is strict, as
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
GATEWAY_API = json.loads((HERE / "gateway_api_crd_schemas.json").read_text())["schemas"]
ISTIO = {
    v: json.loads((HERE / "crds" / f"istio-{v}.json").read_text())["schemas"]
    for v in envoy_istio.ISTIO_VERSIONS
}
SCHEMAS = {**ISTIO[envoy_istio.ISTIO_VERSIONS[-1]], **GATEWAY_API}
# What Istio's validation accepts in a VirtualService's retryOn besides Envoy's HTTP and gRPC
# codes, by minor version (istio/istio pkg/config/validation: supportedRetryOnPolicies).
RETRY_ON = {
    22: {"5xx", "gateway-error", "reset", "connect-failure", "retriable-4xx", "refused-stream",
         "retriable-status-codes", "retriable-headers", "envoy-ratelimited", "http3-post-connect-failure"},
}
RETRY_ON[23] = RETRY_ON[24] = RETRY_ON[25] = RETRY_ON[22] | {"reset-before-request"}


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


@pytest.mark.parametrize("version", envoy_istio.ISTIO_VERSIONS)
@pytest.mark.parametrize("variant", envoy_istio.VARIANTS)
def test_every_object_passes_the_crd_schemas_of_its_version_and_later(variant: str, version: str) -> None:
    docs = envoy_istio.documents(variant, version=version)
    later = [v for v in envoy_istio.ISTIO_VERSIONS if v >= version]
    for target in later:
        schemas = {**ISTIO[target], **GATEWAY_API}
        for doc in docs:
            group, _, api = doc["apiVersion"].partition("/")
            schema = strict(schemas[f"{group}/{api}/{doc['kind']}"])
            jsonschema.validate({k: v for k, v in doc.items() if k in ("spec", "status")}, schema)
    for service in by_kind(docs, "VirtualService"):
        for http in service["spec"]["http"]:
            if "retries" in http:
                policies = set(http["retries"]["retryOn"].split(","))
                for target in later:
                    assert policies <= RETRY_ON[int(target.split(".")[1])], (target, policies)
    assert len(docs) >= 4


@pytest.mark.parametrize("variant", envoy_istio.VARIANTS)
def test_shipped_files_are_rendered_for_the_oldest_supported_version(variant: str) -> None:
    assert shipped(variant) == envoy_istio.documents(variant, version=envoy_istio.ISTIO_VERSIONS[0])


def test_a_field_newer_than_the_version_is_caught() -> None:
    """`vhost.domainName` exists only from 1.25: the 1.22 schema refuses it."""
    doc = envoy_istio.documents("istioctl")[0]
    vhost = next(p for p in doc["spec"]["configPatches"] if p["applyTo"] == "VIRTUAL_HOST")
    vhost["match"]["routeConfiguration"]["vhost"] = {"domainName": envoy_istio.LLM_HOST}
    schema = "networking.istio.io/v1alpha3/EnvoyFilter"
    jsonschema.validate({"spec": doc["spec"]}, strict(ISTIO["1.25"][schema]))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": doc["spec"]}, strict(ISTIO["1.22"][schema]))


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
    vhost_name = vhost_patches[0]["match"]["routeConfiguration"]["vhost"]["name"]
    assert vhost_name == f"{service['spec']['hosts'][0]}:{gateway['spec']['servers'][0]['port']['number']}"
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
