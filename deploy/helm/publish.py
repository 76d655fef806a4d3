"""Package the chart and push it to an OCI registry with Helm's own engine (helm-python-sdk, no
`helm` binary): `python deploy/helm/publish.py --out DIR [--push oci://ghcr.io/OWNER/charts]`.
The chart's version and appVersion must equal the package version (pyproject.toml): the release
tag names all three. Credentials for --push come from REGISTRY_USER and REGISTRY_PASSWORD.
Prints the archive's path and, after a push, the pushed reference and digest."""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/llm-gate"


def versions() -> tuple[str, str, str]:
    """(package version, chart version, chart appVersion)."""
    package = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    return str(package), str(chart["version"]), str(chart["appVersion"])


def package(out: Path) -> Path:
    import helm_python as helm  # the dev extra only

    package_version, chart_version, app_version = versions()
    if not package_version == chart_version == app_version:
        raise SystemExit(f"versions differ: package {package_version}, chart {chart_version}, "
                         f"appVersion {app_version}")
    report = helm.lint(CHART, strict=True, namespace="llm-gate")
    if report["errors"]:
        raise SystemExit(f"helm lint: {report['errors']}")
    out.mkdir(parents=True, exist_ok=True)
    return Path(helm.package(CHART, destination=out))


def push(archive: Path, remote: str) -> dict[str, object]:
    import helm_python as helm

    client = helm.RegistryClient()
    client.login(urlsplit(remote).netloc, os.environ["REGISTRY_USER"], os.environ["REGISTRY_PASSWORD"])
    return client.push(archive, remote)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "build/chart", help="where the .tgz goes")
    ap.add_argument("--push", metavar="oci://HOST/PATH", help="push the archive there")
    args = ap.parse_args()
    archive = package(args.out)
    print(archive)
    if args.push:
        print(push(archive, args.push))


if __name__ == "__main__":
    main()
