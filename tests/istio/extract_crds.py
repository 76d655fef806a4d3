"""Extract the openAPIV3Schema of the Istio kinds we ship, per Istio minor version.

    python -m tests.istio.extract_crds /path/to/istio-api-git-dir 1.22 1.23 1.24 1.25

reads `kubernetes/customresourcedefinitions.gen.yaml` at the newest patch tag of each minor
version of an istio/api clone and writes `tests/istio/crds/istio-MINOR.json` (descriptions
removed, served versions only). The files are inputs of `test_istio_objects.py`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

KINDS = {
    ("networking.istio.io", "EnvoyFilter"),
    ("networking.istio.io", "Gateway"),
    ("networking.istio.io", "VirtualService"),
    ("networking.istio.io", "DestinationRule"),
    ("security.istio.io", "AuthorizationPolicy"),
    ("security.istio.io", "PeerAuthentication"),
}
OUT = Path(__file__).parent / "crds"


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def newest_tag(git_dir: str, minor: str) -> str:
    tags = subprocess.run(["git", "--git-dir", git_dir, "tag"], capture_output=True, text=True, check=True)
    patches = [t for t in tags.stdout.split() if re.fullmatch(rf"{re.escape(minor)}\.\d+", t)]
    return max(patches, key=lambda t: int(t.rsplit(".", 1)[1]))


def extract(git_dir: str, minor: str) -> dict[str, Any]:
    tag = newest_tag(git_dir, minor)
    text = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{tag}:kubernetes/customresourcedefinitions.gen.yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    schemas: dict[str, Any] = {}
    for crd in yaml.safe_load_all(text):
        if not crd or (crd["spec"]["group"], crd["spec"]["names"]["kind"]) not in KINDS:
            continue
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                key = f"{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['kind']}"
                schemas[key] = _strip(version["schema"]["openAPIV3Schema"])
    provenance = (
        f"istio/api {tag}: kubernetes/customresourcedefinitions.gen.yaml, served versions,"
        " descriptions removed"
    )
    return {"provenance": provenance, "schemas": schemas}


def main(argv: list[str]) -> int:
    git_dir, *minors = argv
    OUT.mkdir(exist_ok=True)
    for minor in minors:
        doc = extract(git_dir, minor)
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        (OUT / f"istio-{minor}.json").write_text(text + "\n")
        print(minor, doc["provenance"], len(doc["schemas"]), "kinds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
