"""Shared by the manifest tests: render a kustomize target with kubectl's built-in kustomize or
the Helm chart with Helm's own engine (helm-python-sdk), and validate an object against
Kubernetes 1.30's schemas (kubernetes-validate, offline, strict) or its CRD's schema (Istio's
of every supported minor version)."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy/k8s"
CHART = REPO / "deploy/helm/llm-gate"
KUBERNETES_VERSION = "1.30.0"
CRDS = {"ServiceMonitor": "servicemonitor-v1.json", "PrometheusRule": "prometheusrule-v1.json"}
# Istio's CRD schemas per supported minor version (1.22-1.25), extracted from istio/api.
ISTIO_CRDS = sorted((REPO / "tests/istio/crds").glob("istio-*.json"))
TARGETS = ["base", "overlays/dev", "overlays/production", "overlays/istio"]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate", K8S / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kustomize(target: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is missing"
    command = [kubectl, "kustomize", str(K8S / target)]  # `target` may also be an absolute path
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def helm(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = generator().chart_objects(values)
    return docs


def closed(schema: Any) -> Any:
    """A CRD schema as the API server prunes: a field it does not declare is an error here."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].split("/")[0].endswith(".istio.io"):
        assert ISTIO_CRDS
        for path in ISTIO_CRDS:  # every supported Istio version accepts it
            schema = json.loads(path.read_text())["schemas"][f"{doc['apiVersion']}/{doc['kind']}"]
            jsonschema.validate({"spec": doc["spec"]}, closed(schema))
    elif doc["kind"] in CRDS:
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


# What a secret looks like in a config file: a non-empty value under a secret-named key, client
# API keys, credentials in a URL, a PEM private key or a well-known token prefix.
SECRET_KEYS = re.compile(r"(password|passwd|secret|token|api_keys?|credentials?)$", re.I)
# (A name ending in _file or _env names where a secret is, and is not one.)
SECRET_TEXT = re.compile(
    r"://[^/@\s:]*:[^/@\s]+@|-----BEGIN [A-Z ]*PRIVATE KEY|\bsk-[A-Za-z0-9]{16,}|\bhf_[A-Za-z0-9]{20,}"
)


def secrets_in(value: Any, path: str = "") -> list[str]:
    """Where `value` (a parsed config, or text) holds something that must live in a Secret."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            where = f"{path}.{key}" if path else str(key)
            if SECRET_KEYS.search(str(key)) and inner not in (None, "", {}, []):
                found.append(where)
            found += secrets_in(inner, where)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += secrets_in(inner, f"{path}[{i}]")
    elif isinstance(value, str) and SECRET_TEXT.search(value):
        found.append(path or "<text>")
    return found


def configmap_secrets(doc: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for key, text in (doc.get("data") or {}).items():
        found += [f"{doc['metadata']['name']}:{key}: {w}" for w in secrets_in(text)]
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        found += [f"{doc['metadata']['name']}:{key}: {w}" for w in secrets_in(parsed)]
    return found
