"""Write base/prometheusrule.yaml from deploy/alerts.yaml (one source for the rules):
`python deploy/k8s/make_prometheusrule.py`. A test fails when the two differ."""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
HEADER = "# Generated from deploy/alerts.yaml by deploy/k8s/make_prometheusrule.py; edit that file.\n"


def render() -> str:
    groups = yaml.safe_load((HERE.parent / "alerts.yaml").read_text(encoding="utf-8"))["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "llm-gate"},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=200)


if __name__ == "__main__":
    (HERE / "base" / "prometheusrule.yaml").write_text(render(), encoding="utf-8")
