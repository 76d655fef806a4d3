"""The Helm chart through Helm's own engine (helm-python-sdk's libhelm_c, no helm binary):
lint, package, values schema, every rendered object against Kubernetes 1.30's schemas, the
same objects as kustomize for the same settings, secrets only ever from Secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from extproc.checks import secret_warnings
from extproc.config import parse_config

from .manifests import (
    CHART,
    SECRET_KEYS,
    SECRET_TEXT,
    TARGETS,
    configmap_secrets,
    generator,
    helm,
    kustomize,
    one,
    validate,
)

SECRETS = {
    "apiKeys": {"existingSecret": "llm-gate-api-keys"},
    "redis": {"existingSecret": "llm-gate-redis", "passwordKey": "password"},
}


def key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_and_helm_apply_the_same_objects(target: str) -> None:
    normalise = generator().normalise
    from_helm = {key(n): n for n in map(normalise, helm(generator().target_values(target)))}
    from_kustomize = {key(n): n for n in map(normalise, kustomize(target))}
    assert sorted(from_kustomize) == sorted(from_helm)
    for name, doc in from_helm.items():
        if doc["kind"] == "ConfigMap":  # the same config; the generated file adds a comment
            for data in (doc["data"], from_kustomize[name]["data"]):
                data.update({k: yaml.safe_load(v) for k, v in data.items()})
        assert from_kustomize[name] == doc, name


@pytest.mark.parametrize("values", [{}, SECRETS, {"gate": {"workers": 2}, "redis": {"mode": "internal"},
                                                   "networkPolicy": {"enabled": True},
                                                   "istio": {"enabled": True, "metricsOutsideMesh": False}}])
def test_every_object_the_chart_renders_passes_its_schema(values: dict[str, Any]) -> None:
    docs = helm(values)
    assert docs
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("target", ["overlays/dev", "overlays/production", "overlays/istio"])
def test_the_chart_lints_clean_and_packages(target: str, tmp_path: Path) -> None:
    values = generator().target_values(target)
    report = helm_python.lint(CHART, values, strict=True, namespace="llm-gate", kube_version="v1.30.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    archive = Path(helm_python.package(CHART, destination=tmp_path))
    assert archive.name == "llm-gate-0.1.0.tgz"
    packaged = helm_python.Chart.load_archive(archive.read_bytes())
    direct = helm_python.Chart.load(str(CHART))
    rendered = [chart.render(values, name="llm-gate", namespace="llm-gate") for chart in (packaged, direct)]
    assert rendered[0] == rendered[1]


@pytest.mark.parametrize("values", [
    {"config": {"identity": {"api_keys": {"sk-live-1": {"tenant": "acme"}}}}},
    {"redis": {"url": "redis://:hunter2@redis:6379/0"}},
    {"config": {"store": {"redis_url": "redis://default:hunter2@redis:6379/0"}}},
    {"config": {"store": {"redis": {"mode": "single", "url": "redis://r:6379/0", "password": "hunter2"}}}},
    {"image": {"digest": "latest"}},
    {"gate": {"workers": 0}},
    {"autoscaling": {"targetAverageValue": "many"}},
    {"unknown": True},
])
def test_the_values_schema_refuses_secrets_in_config_and_bad_values(values: dict[str, Any]) -> None:
    chart = helm_python.Chart.load(str(CHART))
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(values)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(values, name="llm-gate", namespace="llm-gate")


def test_secrets_come_from_existing_secrets_as_a_file_and_variables() -> None:
    docs = helm(SECRETS)
    config = yaml.safe_load(one(docs, "ConfigMap", "llm-gate-config")["data"]["gate.yaml"])
    pod = one(docs, "Deployment", "llm-gate")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "llm-gate-api-keys"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] and config["identity"]["api_keys_file"] == f"{mount['mountPath']}/api_keys.yaml"
    env = {e["name"]: e for e in container["env"]}
    assert config["store"] == {"redis": {"mode": "single", "url": "redis://redis.llm-gate.svc.cluster.local:6379/0",
                                         "password_env": "LLM_GATE_REDIS_PASSWORD"}}
    assert env["LLM_GATE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "llm-gate-redis",
                                                                          "key": "password"}
    assert not [d for d in docs if d["kind"] == "Secret"]  # the chart never holds a secret itself


def test_the_gate_reads_the_api_keys_file_the_chart_mounts(tmp_path: Path) -> None:
    docs = helm({"apiKeys": {"existingSecret": "llm-gate-api-keys"}})
    config = parse_config(one(docs, "ConfigMap", "llm-gate-config")["data"]["gate.yaml"])
    (container,) = one(docs, "Deployment", "llm-gate")["spec"]["template"]["spec"]["containers"]
    assert config.identity.api_keys_file is not None
    mounts = [m["mountPath"] + "/" for m in container["volumeMounts"]]
    assert any(str(config.identity.api_keys_file).startswith(m) for m in mounts)
    # What the Secret holds (kubectl create secret generic --from-file=api_keys.yaml), as mounted.
    mounted = tmp_path / config.identity.api_keys_file.name
    mounted.write_text("sk-live-1: {tenant: acme, tier: premium}\n")
    keys = config.identity.model_copy(update={"api_keys_file": mounted}).keys()
    assert keys["sk-live-1"].tenant == "acme" and secret_warnings(config) == []


def test_sentinel_from_config_gets_both_password_variables() -> None:
    sentinels = ["s-0.redis:26379", "s-1.redis:26379"]
    sentinel = {"mode": "sentinel", "sentinels": sentinels, "master_name": "gate"}
    values = {"config": {"store": {"redis": sentinel}},
              "redis": {"existingSecret": "redis", "passwordKey": "pw", "sentinelPasswordKey": "spw"}}
    docs = helm(values)
    config = yaml.safe_load(one(docs, "ConfigMap", "llm-gate-config")["data"]["gate.yaml"])
    variables = {"password_env": "LLM_GATE_REDIS_PASSWORD",
                 "sentinel_password_env": "LLM_GATE_REDIS_SENTINEL_PASSWORD"}
    assert config["store"] == {"redis": sentinel | variables}
    (container,) = one(docs, "Deployment", "llm-gate")["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs == {"LLM_GATE_REDIS_PASSWORD": {"name": "redis", "key": "pw"},
                    "LLM_GATE_REDIS_SENTINEL_PASSWORD": {"name": "redis", "key": "spw"}}


def test_image_by_digest_and_one_cpu_per_gate_process() -> None:
    digest = "sha256:" + "ab" * 32
    docs = helm({"image": {"registry": "registry.example.com", "repository": "ai/llm-gate", "digest": digest},
                 "gate": {"workers": 3}})
    images = {c["image"] for d in docs if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"registry.example.com/ai/llm-gate@{digest}"}
    gate = one(docs, "Deployment", "llm-gate")
    (container,) = gate["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] == "3"
    assert [p["containerPort"] for p in container["ports"]] == [50051, 9464, 9465, 9466]
    endpoints = one(docs, "ServiceMonitor", "llm-gate")["spec"]["endpoints"]
    assert [e["port"] for e in endpoints] == ["metrics", "metrics-1", "metrics-2"]
    config = yaml.safe_load(one(docs, "ConfigMap", "llm-gate-config")["data"]["gate.yaml"])
    assert config["server"]["workers"] == 3


CHART_VALUES = [generator().target_values(t) for t in TARGETS] + [SECRETS]


@pytest.mark.parametrize("source", [*TARGETS, *(f"chart:{i}" for i in range(len(CHART_VALUES)))])
def test_no_configmap_nor_any_object_holds_a_secret(source: str) -> None:
    chart = source.startswith("chart:")
    docs = helm(CHART_VALUES[int(source.split(":")[1])]) if chart else kustomize(source)
    configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert configmaps
    for doc in configmaps:
        assert configmap_secrets(doc) == []
    # Nor any other object: no secret text anywhere, a secret-named variable only by reference.
    assert not [d for d in docs if d["kind"] == "Secret"]
    for doc in docs:
        assert not SECRET_TEXT.search(yaml.safe_dump(doc)), key(doc)
        for pod in pod_specs(doc):
            for container in pod["containers"]:
                for env in container.get("env", []):
                    if SECRET_KEYS.search(env["name"]):
                        assert "valueFrom" in env and "value" not in env, (key(doc), env["name"])


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    template = doc.get("spec", {}).get("template") if isinstance(doc.get("spec"), dict) else None
    return [template["spec"]] if isinstance(template, dict) else []


@pytest.mark.parametrize("planted", [
    "identity:\n  api_keys:\n    sk-abc: {tenant: acme}\n",
    "store:\n  redis_url: redis://default:hunter2@redis:6379/0\n",
    "store:\n  redis_password: hunter2\n",
    "server:\n  admin_token: abc\n",
    "tls: |\n  -----BEGIN RSA PRIVATE KEY-----\n",
    "routing:\n  pools:\n    p: {upstream: sk-0123456789abcdef0123}\n",
])
def test_the_secret_check_finds_a_planted_secret(planted: str) -> None:
    doc = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"gate.yaml": planted}}
    assert configmap_secrets(doc)


def test_without_autoscaling_the_deployment_holds_the_replica_count() -> None:
    docs = helm({"autoscaling": {"enabled": False}, "gate": {"replicas": 4}})
    assert one(docs, "Deployment", "llm-gate")["spec"]["replicas"] == 4
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert "replicas" not in one(helm({}), "Deployment", "llm-gate")["spec"]


def test_extra_volumes_carry_tls_material_and_a_secret_variable_needs_a_reference() -> None:
    tls = {"name": "redis-tls", "secret": {"secretName": "redis-tls"}}
    mount = {"name": "redis-tls", "mountPath": "/etc/llm-gate/secrets/redis-tls", "readOnly": True}
    token = {"name": "UPSTREAM_TOKEN", "valueFrom": {"secretKeyRef": {"name": "up", "key": "token"}}}
    values = {"gate": {"extraVolumes": [tls], "extraVolumeMounts": [mount], "extraEnv": [token]}}
    docs = helm(values)
    for doc in docs:
        validate(doc)
    pod = one(docs, "Deployment", "llm-gate")["spec"]["template"]["spec"]
    assert tls in pod["volumes"]
    assert "redis-tls" in {m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert "UPSTREAM_TOKEN" in {e["name"] for e in pod["containers"][0]["env"]}
    with pytest.raises(helm_python.HelmValuesError):
        helm({"gate": {"extraEnv": [{"name": "UPSTREAM_TOKEN", "value": "sk-0123456789abcdef"}]}})


def test_ambient_mode_labels_for_ztunnel_and_keeps_policies_at_layer_4() -> None:
    docs = helm({"namespace": {"create": True}, "networkPolicy": {"enabled": True},
                 "istio": {"enabled": True, "dataplane": "ambient"}})
    for doc in docs:
        validate(doc)
    assert one(docs, "Namespace", "llm-gate")["metadata"]["labels"]["istio.io/dataplane-mode"] == "ambient"
    for doc in (d for d in docs if d["kind"] == "Deployment"):
        template = doc["spec"]["template"]["metadata"]
        assert template["labels"]["istio.io/dataplane-mode"] == "ambient"
        assert "sidecar.istio.io/inject" not in template["labels"]
        assert "traffic.sidecar.istio.io/excludeInboundPorts" not in template.get("annotations", {})
    # Without a waypoint ztunnel enforces no paths or methods: no L7 attribute in any rule.
    for policy in (d for d in docs if d["kind"] == "AuthorizationPolicy"):
        for rule in policy["spec"]["rules"]:
            for to in rule.get("to", []):
                assert set(to["operation"]) == {"ports"}, policy["metadata"]["name"]


def test_the_gate_reads_the_redis_password_variables_the_chart_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = {"mode": "sentinel", "sentinels": ["s-0.redis:26379"], "master_name": "gate"}
    values = {"config": {"store": {"redis": sentinel}},
              "redis": {"existingSecret": "redis", "passwordKey": "pw", "sentinelPasswordKey": "spw"}}
    config = parse_config(one(helm(values), "ConfigMap", "llm-gate-config")["data"]["gate.yaml"])
    monkeypatch.setenv("LLM_GATE_REDIS_PASSWORD", "from-secret")
    monkeypatch.setenv("LLM_GATE_REDIS_SENTINEL_PASSWORD", "sentinels-own")
    redis = config.store.redis
    assert (redis.password(), redis.sentinel_password()) == ("from-secret", "sentinels-own")
