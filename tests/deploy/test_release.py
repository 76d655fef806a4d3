"""The image's build inputs and the release workflow, without building: the lock pins every
runtime dependency (and nothing of the demo or dev extras) at versions pyproject.toml allows,
the build script parses, and .github/workflows/release.yml passes zizmor (offline) and builds,
checks, pushes by digest and scans each architecture before it publishes the index.
`make image-check` builds and starts the image itself."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github/workflows/release.yml"


def pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "deploy/image/requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_the_lock_pins_every_runtime_dependency_and_no_extra() -> None:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    pins = lock()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name}: run python deploy/image/lock.py"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    runtime = {canonicalize_name(Requirement(s).name) for s in project["dependencies"]}
    extras = project["optional-dependencies"]
    for extra in ("demo", "dev"):
        for spec in extras[extra]:
            name = canonicalize_name(Requirement(spec).name)
            if name not in runtime:
                assert name not in pins, f"{name} of [{extra}] in the runtime lock"


def test_the_build_script_parses_and_installs_the_lock() -> None:
    script = REPO / "deploy/image/build.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "deploy/image/requirements.lock" in text and "--no-index" in text and "[demo]" not in text
    assert "--config.user 10001:10001" in text


def test_the_release_workflow_passes_zizmor() -> None:
    zizmor = shutil.which("zizmor") or str(Path(sys.executable).parent / "zizmor")
    out = subprocess.run([zizmor, "--offline", "--format", "json", str(WORKFLOW)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == []


def test_the_release_builds_checks_pushes_by_digest_and_scans_before_it_publishes() -> None:
    flow = yaml.safe_load(WORKFLOW.read_text())
    assert flow[True]["push"]["tags"] == ["v*.*.*"]  # YAML 1.1 reads the key `on` as True
    assert flow["permissions"] == {}
    image, index = flow["jobs"]["image"], flow["jobs"]["index"]
    assert {m["arch"] for m in image["strategy"]["matrix"]["include"]} == {"amd64", "arm64"}
    steps = [s.get("run", "") + s.get("uses", "") for s in image["steps"]]
    order = [next(i for i, s in enumerate(steps) if key in s)
             for key in ("deploy/image/build.sh", "deploy/image/check.py", "--digestfile", "trivy-action")]
    assert order == sorted(order)
    assert index["needs"] == "image" and "manifest push" in index["steps"][0]["run"]
    chart = flow["jobs"]["chart"]
    assert chart["needs"] == "index" and "deploy/helm/publish.py --push" in chart["steps"][-1]["run"]
    for step in [*image["steps"], *chart["steps"]]:
        if "uses" in step:  # third-party code pinned to a commit
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]


def test_the_chart_packages_at_the_package_version(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("publish", REPO / "deploy/helm/publish.py")
    assert spec and spec.loader
    publish = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(publish)
    version = pyproject()["project"]["version"]  # type: ignore[index]
    assert publish.versions() == (version, version, version)
    archive = publish.package(tmp_path)
    assert archive.name == f"llm-gate-{version}.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"llm-gate/values.schema.json", "llm-gate/files/alerts.yaml"} <= names
