"""Write the kustomize directories from the Helm chart, the one source of the manifests:
`python deploy/k8s/generate.py` (needs the dev extra: helm-python-sdk renders with Helm's own
engine). Each target's `values.yaml` holds its settings as chart values; everything else in
the directory is generated, so `kubectl apply -k` and `helm install -f values.yaml` apply the
same objects. It also copies deploy/alerts.yaml into the chart (files/alerts.yaml).
A test fails when a generated file differs from what this writes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART = REPO / "deploy/helm/llm-gate"
ALERTS = REPO / "deploy/alerts.yaml"
CHART_ALERTS = CHART / "files/alerts.yaml"
TARGETS = ("base", "overlays/dev", "overlays/production", "overlays/istio")
RELEASE = "llm-gate"
NAMESPACE = "llm-gate"
CONFIG_MAP = f"{RELEASE}-config"
# Helm's bookkeeping: not part of the objects' meaning, and not true of a kustomize apply.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
# Helm rolls pods on a config change by this annotation; kustomize by the ConfigMap's hashed name.
CHECKSUM = "checksum/config"
HEADER = "# Generated from deploy/helm/llm-gate with {values} by deploy/k8s/generate.py: edit those.\n"


def target_values(target: str) -> dict[str, Any]:
    values = yaml.safe_load((HERE / target / "values.yaml").read_text(encoding="utf-8"))
    return values or {}


def chart_objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders for `values` (release llm-gate in namespace llm-gate)."""
    import helm_python as helm  # the dev extra only

    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(values)
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(rendered[path]) if d]
    return docs


def _strip(meta: dict[str, Any]) -> None:
    for label in HELM_LABELS:
        meta.get("labels", {}).pop(label, None)
    annotations = meta.get("annotations")
    if annotations is not None:
        annotations.pop(CHECKSUM, None)
        if not annotations:
            del meta["annotations"]


def normalise(doc: dict[str, Any]) -> dict[str, Any]:
    """An object as both tools apply it: no Helm bookkeeping, the ConfigMap under its plain name."""
    doc = yaml.safe_load(re.sub(rf"\b{CONFIG_MAP}-[a-z0-9]{{10}}\b", CONFIG_MAP, yaml.safe_dump(doc)))
    _strip(doc["metadata"])
    template = doc.get("spec", {}).get("template") if isinstance(doc.get("spec"), dict) else None
    if isinstance(template, dict) and "metadata" in template:
        _strip(template["metadata"])
    return doc


def files_for(target: str) -> dict[str, str]:
    """The generated files of one kustomize directory, by name."""
    values_file = f"deploy/k8s/{target}/values.yaml"
    header = HEADER.format(values=values_file)
    objects = [normalise(d) for d in chart_objects(target_values(target))]
    (config_map,) = [d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP]
    resources = [d for d in objects if d is not config_map]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["resources.yaml"],
        # Named with a hash of gate.yaml: a changed config rolls the pods onto it.
        "configMapGenerator": [{
            "name": CONFIG_MAP,
            "namespace": NAMESPACE,
            "files": ["gate.yaml"],
            "options": {"labels": config_map["metadata"]["labels"]},
        }],
    }
    dump = yaml.safe_dump_all(resources, sort_keys=False, width=120)
    return {
        "kustomization.yaml": header + yaml.safe_dump(kustomization, sort_keys=False),
        "resources.yaml": header + dump,
        "gate.yaml": header + config_map["data"]["gate.yaml"],
    }


def main() -> None:
    CHART_ALERTS.write_text(ALERTS.read_text(encoding="utf-8"), encoding="utf-8")
    for target in TARGETS:
        for name, text in files_for(target).items():
            (HERE / target / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
