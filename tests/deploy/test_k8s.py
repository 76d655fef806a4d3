"""The Kubernetes manifests (kustomize base and overlays) as `kubectl kustomize` renders them:
every object against Kubernetes' own schemas (kubernetes-validate, offline, strict), the
ServiceMonitor and PrometheusRule against prometheus-operator's CRD schemas, and the parts
agree with each other and with the gate: probes, ports, config, one scheduler per pool."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from extproc import cli
from extproc.checks import cross_check
from extproc.config import parse_config

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy/k8s"
KUBERNETES_VERSION = "1.30.0"
CRDS = {"ServiceMonitor": "servicemonitor-v1.json", "PrometheusRule": "prometheusrule-v1.json"}
TARGETS = ["base", "overlays/dev", "overlays/production"]


def render(target: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is missing"
    command = [kubectl, "kustomize", str(K8S / target)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in CRDS:
        schema = json.loads((K8S / "schemas" / CRDS[doc["kind"]]).read_text())
        # Not jsonschema.validate: it checks the schema itself first, and the CRD's Go regexes
        # (`^(?i)...`) are not Python's. Fields with such patterns are not used here.
        jsonschema.Draft7Validator(schema).validate(doc)
    else:
        # It edits the object it is given.
        kubernetes_validate.validate(copy.deepcopy(doc), KUBERNETES_VERSION, strict=True)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_passes_its_schema(target: str) -> None:
    docs = render(target)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ServiceMonitor", "PrometheusRule"} <= kinds
    for doc in docs:
        validate(doc)
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "llm-gate"


def test_the_checks_catch_a_broken_object() -> None:
    docs = render("base")
    deployment = copy.deepcopy(one(docs, "Deployment", "llm-gate"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = copy.deepcopy(one(docs, "ServiceMonitor", "llm-gate"))
    monitor["spec"]["endpoints"][0]["interval"] = "often"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


@pytest.mark.parametrize("target", TARGETS)
def test_the_gate_pods_probe_grpc_health_on_the_configured_port_with_one_worker(target: str) -> None:
    docs = render(target)
    gate = one(docs, "Deployment", "llm-gate")
    pod = gate["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    configmap = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert configmap["metadata"]["name"].startswith("llm-gate-config-")  # hashed: a change rolls the pods
    config = parse_config(configmap["data"]["gate.yaml"])
    assert config.server.workers == 1 and config.server.host == "0.0.0.0"
    assert cross_check(config) == []
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == config.server.port, probe
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config.server.port, "metrics": config.server.metrics_port}
    args, rest = cli.parser().parse_known_args(container["args"])
    assert args.command == "serve" and not rest
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert str(args.config) == f"{mount['mountPath']}/gate.yaml"
    assert container["resources"]["requests"] and pod["securityContext"]["runAsNonRoot"]
    assert pod["terminationGracePeriodSeconds"] > config.server.grace_seconds
    selector = gate["spec"]["selector"]["matchLabels"]
    for kind in ("PodDisruptionBudget",):
        assert one(docs, kind, "llm-gate")["spec"]["selector"]["matchLabels"] == selector
    hpa = one(docs, "HorizontalPodAutoscaler", "llm-gate")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "llm-gate" and hpa["minReplicas"] <= gate["spec"]["replicas"]
    service = one(docs, "Service", "llm-gate")
    assert service["spec"]["selector"] == selector
    monitor = one(docs, "ServiceMonitor", "llm-gate")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    # The job label the alerts watch (up{job="llm-gate"}).
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "llm-gate"


@pytest.mark.parametrize("target", TARGETS)
def test_one_scheduler_per_pool_at_the_address_the_gates_use(target: str) -> None:
    docs = render(target)
    config = parse_config(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["gate.yaml"])
    remote = {pool: a.scheduler for pool, a in config.admission.pools.items() if a.scheduler}
    assert remote
    schedulers = [d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"]
    assert len(schedulers) == len(remote)
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


def test_the_prometheus_rule_is_the_shipped_alerts_file() -> None:
    spec = importlib.util.spec_from_file_location("make_prometheusrule", K8S / "make_prometheusrule.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (K8S / "base/prometheusrule.yaml").read_text() == module.render(), \
        "run python deploy/k8s/make_prometheusrule.py"
    rule = one(render("base"), "PrometheusRule", "llm-gate")
    alerts = yaml.safe_load((REPO / "deploy/alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
