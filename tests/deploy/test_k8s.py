"""The Kubernetes manifests (kustomize base and overlays) as `kubectl kustomize` renders them:
every object against Kubernetes 1.30's own schemas or its CRD's, the generated directories
current with the chart they come from, and the parts agree with each other and with the gate:
probes, ports, config, one scheduler per pool, the policies around vLLM and the schedulers."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from extproc import cli
from extproc.checks import cross_check, secret_warnings
from extproc.config import parse_config

from .manifests import K8S, REPO, TARGETS, generator, kustomize, one, validate


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_passes_its_schema(target: str) -> None:
    docs = kustomize(target)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ServiceMonitor", "PrometheusRule", "ServiceAccount"} <= kinds
    for doc in docs:
        validate(doc)
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "llm-gate"


@pytest.mark.parametrize("target", TARGETS)
def test_the_generated_files_are_current_with_the_chart(target: str) -> None:
    for name, text in generator().files_for(target).items():
        assert (K8S / target / name).read_text() == text, f"{target}/{name}: python deploy/k8s/generate.py"


def test_the_checks_catch_a_broken_object() -> None:
    docs = kustomize("overlays/istio")
    deployment = copy.deepcopy(one(docs, "Deployment", "llm-gate"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = copy.deepcopy(one(docs, "ServiceMonitor", "llm-gate"))
    monitor["spec"]["endpoints"][0]["interval"] = "often"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
    policy = copy.deepcopy(one(docs, "AuthorizationPolicy", "llm-gate"))
    policy["spec"]["rules"][0]["from"][0]["source"]["principal"] = ["typo"]
    with pytest.raises(jsonschema.ValidationError):
        validate(policy)


def gate_config(docs: list[dict[str, Any]]) -> Any:
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    return parse_config(configmap["data"]["gate.yaml"])


@pytest.mark.parametrize("target", TARGETS)
def test_the_gate_pods_probe_grpc_health_on_the_configured_port(target: str) -> None:
    docs = kustomize(target)
    gate = one(docs, "Deployment", "llm-gate")
    pod = gate["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    configmap = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert configmap["metadata"]["name"].startswith("llm-gate-config-")  # hashed: a change rolls the pods
    config = parse_config(configmap["data"]["gate.yaml"])
    assert config.server.host == "0.0.0.0"
    assert cross_check(config) == [] and secret_warnings(config) == []
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == config.server.port, probe
    # Liveness is a separate, lighter check than readiness: a busy event loop is not restarted.
    assert container["livenessProbe"] == container["livenessProbe"] | {"tcpSocket": {"port": "grpc"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == config.server.port and ports["metrics"] == config.server.metrics_port
    args, rest = cli.parser().parse_known_args(container["args"])
    assert args.command == "serve" and not rest
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert str(args.config) == f"{mount['mountPath']}/gate.yaml"
    assert pod["securityContext"]["runAsNonRoot"]
    # One CPU per gate process (dev asks for a quarter).
    cpu = container["resources"]["requests"]["cpu"]
    per_worker = 0.25 if target == "overlays/dev" else 1.0
    assert (int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)) == per_worker * config.server.workers
    # The same limit: the cgroup quota the embedder sizes its threads from (none in dev).
    assert container["resources"]["limits"].get("cpu") == (None if target == "overlays/dev" else cpu)
    # preStop lets the endpoints drop the pod; then the gate drains (NOT_SERVING, still answering)
    # and finishes open streams, all within the termination grace period.
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    stopping = pre_stop + config.server.drain_seconds + config.server.grace_seconds
    assert pod["terminationGracePeriodSeconds"] > stopping
    selector = gate["spec"]["selector"]["matchLabels"]
    assert one(docs, "PodDisruptionBudget", "llm-gate")["spec"]["selector"]["matchLabels"] == selector
    service = one(docs, "Service", "llm-gate")
    assert service["spec"]["selector"] == selector
    # A headless Service for Envoy's STRICT_DNS cluster: every gate pod, the gRPC port only
    # (a metrics port there would scrape every pod twice).
    headless = one(docs, "Service", "llm-gate-headless")["spec"]
    assert headless["clusterIP"] == "None" and headless["selector"] == selector
    assert [p["name"] for p in headless["ports"]] == ["grpc-extproc"]
    monitor = one(docs, "ServiceMonitor", "llm-gate")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    # The job label the alerts watch (up{job="llm-gate"}).
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "llm-gate"
    # kube-prometheus-stack's Prometheus selects ServiceMonitors and rules on `release`.
    for kind in ("ServiceMonitor", "PrometheusRule"):
        for doc in (d for d in docs if d["kind"] == kind):
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize("target", TARGETS)
def test_the_autoscaler_scales_on_open_streams_per_pod(target: str) -> None:
    docs = kustomize(target)
    gate = one(docs, "Deployment", "llm-gate")
    hpa = one(docs, "HorizontalPodAutoscaler", "llm-gate")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-gate"}
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    assert "replicas" not in gate["spec"]  # the HPA owns it: an apply does not reset the count
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    name = metric["pods"]["metric"]["name"]
    assert name == "gate_streams_active"
    assert f'"{name}"' in (REPO / "extproc/metrics.py").read_text()  # a metric the gate exports


@pytest.mark.parametrize("target", TARGETS)
def test_one_scheduler_per_pool_at_the_address_the_gates_use(target: str) -> None:
    docs = kustomize(target)
    config = gate_config(docs)
    remote = {pool: a.scheduler for pool, a in config.admission.pools.items() if a.scheduler}
    assert remote
    schedulers = [d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"]
    assert len(schedulers) == len(remote)
    images = {c["image"] for d in docs if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"] if c["name"] != "redis"}
    assert images == {"ghcr.io/llm-gate/llm-gate:0.1.0"}  # every part on the released image, tagged
    for deployment in schedulers:
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        pool = args[args.index("--pool") + 1]
        port = int(args[args.index("--port") + 1])
        name = deployment["metadata"]["name"]
        service = one(docs, "Service", name)
        assert any(p["port"] == port for p in service["spec"]["ports"])
        assert remote[pool] == f"{name}.llm-gate.svc.cluster.local:{port}"


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def pod_labels(docs: list[dict[str, Any]], component: str) -> list[dict[str, str]]:
    return [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == component]


@pytest.mark.parametrize("target", ["overlays/production", "overlays/istio"])
def test_only_the_gateway_reaches_vllm_and_only_the_gates_reach_the_schedulers(target: str) -> None:
    docs = kustomize(target)
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    gates, schedulers = pod_labels(docs, "gate"), pod_labels(docs, "scheduler")
    scheduler_ports = {int(p["port"]) for d in docs if d["kind"] == "Service"
                       and d["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler"
                       for p in d["spec"]["ports"] if p["name"] == "grpc-scheduler"}
    # The schedulers' gRPC port: from gate pods of this namespace, nothing else.
    policy = policies["llm-gate-scheduler"]
    assert all(selects(policy["podSelector"]["matchLabels"], s) for s in schedulers)
    grpc_rules = [r for r in policy["ingress"] if {p["port"] for p in r["ports"]} & scheduler_ports]
    (rule,) = grpc_rules
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"} and all(selects(peer["podSelector"]["matchLabels"], g) for g in gates)
    # vLLM: the gateway's pods, and the schedulers (capacity from /metrics); no one else.
    vllm = policies["llm-gate-vllm"]
    assert vllm["policyTypes"] == ["Ingress"] and len(vllm["ingress"]) == 1
    peers = vllm["ingress"][0]["from"]
    assert [p["namespaceSelector"]["matchLabels"] for p in peers] == [
        {"kubernetes.io/metadata.name": "istio-system"}, {"kubernetes.io/metadata.name": "llm-gate"}]
    assert peers[0]["podSelector"]["matchLabels"] == {"istio": "ingressgateway"}
    assert all(selects(peers[1]["podSelector"]["matchLabels"], s) for s in schedulers)
    assert not any(selects(peers[1]["podSelector"]["matchLabels"], g) for g in gates)
    # The gates' gRPC port: the gateway only.
    gate_rules = policies["llm-gate"]["ingress"]
    (grpc,) = [r for r in gate_rules if {p["port"] for p in r["ports"]} == {50051}]
    assert grpc["from"] == [peers[0]]


def test_under_istio_the_namespace_injects_and_policies_name_the_identities() -> None:
    docs = kustomize("overlays/istio")
    namespace = one(docs, "Namespace", "llm-gate")
    assert namespace["metadata"]["labels"]["istio-injection"] == "enabled"
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "AuthorizationPolicy"}
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    gate_sa = one(docs, "Deployment", "llm-gate")["spec"]["template"]["spec"]["serviceAccountName"]
    assert gate_sa in accounts
    (to_scheduler,) = policies["llm-gate-scheduler"]["spec"]["rules"]
    assert to_scheduler["from"] == [{"source": {"principals": [f"cluster.local/ns/llm-gate/sa/{gate_sa}"]}}]
    vllm = policies["llm-gate-vllm"]["spec"]
    assert vllm["action"] == "ALLOW"
    gateway_rule, metrics_rule = vllm["rules"]
    assert gateway_rule == {"from": [{"source": {
        "principals": ["cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"]}}]}
    assert metrics_rule["to"] == [{"operation": {"methods": ["GET"], "paths": ["/metrics"]}}]
    # Prometheus scrapes the metrics ports outside the mesh: it needs no mesh certificate.
    pod = one(docs, "Deployment", "llm-gate")["spec"]["template"]["metadata"]
    assert pod["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"] == "9464"
    assert pod["labels"]["sidecar.istio.io/inject"] == "true"


def test_the_prometheus_rule_is_the_shipped_alerts_file() -> None:
    assert (REPO / "deploy/helm/llm-gate/files/alerts.yaml").read_text() == \
        (REPO / "deploy/alerts.yaml").read_text(), "run python deploy/k8s/generate.py"
    rule = one(kustomize("base"), "PrometheusRule", "llm-gate")
    alerts = yaml.safe_load((REPO / "deploy/alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]


def test_an_operator_overlay_sets_the_image_by_digest_and_replaces_the_config(tmp_path: Path) -> None:
    digest = "sha256:" + "0" * 64
    config = (K8S / "overlays/production/gate.yaml").read_text()
    (tmp_path / "gate.yaml").write_text(config.replace("grace_seconds: 20", "grace_seconds: 15"))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S / "overlays/production", tmp_path)],
        "images": [{"name": "ghcr.io/llm-gate/llm-gate", "newName": "registry.example.com/llm-gate",
                    "digest": digest}],
        "configMapGenerator": [{"name": "llm-gate-config", "namespace": "llm-gate", "behavior": "replace",
                                "files": ["gate.yaml"]}],
    }))
    docs = kustomize(str(tmp_path))
    images = {c["image"] for d in docs if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"registry.example.com/llm-gate@{digest}"}
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert parse_config(configmap["data"]["gate.yaml"]).server.grace_seconds == 15
    volumes = {v["configMap"]["name"] for d in docs if d["kind"] == "Deployment"
               for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    assert volumes == {configmap["metadata"]["name"]}


def test_envoy_given_the_headless_service_resolves_every_gate_pod() -> None:
    docs = kustomize("overlays/production")
    headless = one(docs, "Service", "llm-gate-headless")
    (port,) = [p["port"] for p in headless["spec"]["ports"]]
    name = f"{headless['metadata']['name']}.{headless['metadata']['namespace']}.svc.cluster.local"
    out = subprocess.run([sys.executable, "-m", "extproc.cli", "envoy-config", "--gate", f"{name}:{port}"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
    clusters = yaml.safe_load(out.stdout)["static_resources"]["clusters"]
    (gate,) = [c for c in clusters if name in yaml.safe_dump(c)]
    assert gate["type"] == "STRICT_DNS"
