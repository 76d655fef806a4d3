from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from extproc import envoy_config
from extproc.cli import main
from extproc.config import load_config
from load.stack import envoy_binary

REPO = Path(__file__).resolve().parent.parent


def test_example_config_is_valid_and_documents_every_section() -> None:
    config = load_config(REPO / "config.example.yaml")
    text = (REPO / "config.example.yaml").read_text()
    for section in type(config).model_fields:
        assert f"\n{section}:" in text or text.startswith(f"{section}:"), section


def test_check_config_prints_every_error_with_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: -1\n  workers: 0\nvalidation:\n  max_body_bytes: big\nnope: 1\n")
    assert main(["check-config", str(bad)]) == 1
    out = capsys.readouterr().out
    for where in ("server.port", "server.workers", "validation.max_body_bytes", "nope"):
        assert f"{bad}: {where}:" in out
    assert "4 problem(s)" in out
    good = tmp_path / "good.yaml"
    good.write_text("server: {port: 6000}\n")
    assert main(["check-config", str(good)]) == 0


def test_check_config_reports_bad_yaml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("server: [unclosed\n")
    assert main(["check-config", str(bad)]) == 1
    assert main(["check-config", str(tmp_path / "missing.yaml")]) == 1


@pytest.mark.parametrize(
    ("path", "args"),
    [
        ("envoy/envoy.yaml", []),
        ("envoy/ext_proc-include.yaml", ["--include"]),
        ("istio/envoyfilter.yaml", ["--istio"]),
        ("istio/envoyfilter-helm.yaml", ["--istio", "helm"]),
        ("istio/gateway-api.yaml", ["--istio", "gateway-api"]),
    ],
)
def test_shipped_envoy_files_are_what_the_generator_writes(
    path: str, args: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.yaml"
    assert envoy_config.main([*args, "--out", str(out)]) == 0
    assert (REPO / path).read_text() == out.read_text(), f"regenerate {path} with llm-gate envoy-config"


def test_shipped_bootstrap_passes_envoy_validate_without_warnings() -> None:
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(REPO / "envoy/envoy.yaml"), "--use-dynamic-base-id"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "[warning]" in line]
    assert not warnings, warnings  # no deprecated fields, no missing connection limit


def test_include_snippet_validates_inside_a_minimal_bootstrap(tmp_path: Path) -> None:
    import yaml

    snippet = yaml.safe_load((REPO / "envoy/ext_proc-include.yaml").read_text())
    doc = envoy_config.bootstrap(
        listen=("127.0.0.1", 10000),
        admin=("127.0.0.1", 9901),
        gate=[("127.0.0.1", 50051)],
        pools={"primary": [("127.0.0.1", 8001)]},
    )
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [*snippet["http_filters"], hcm["http_filters"][-1]]
    hcm["early_header_mutation_extensions"] = snippet["early_header_mutation_extensions"]
    hcm["local_reply_config"] = snippet["local_reply_config"]
    hcm["route_config"]["virtual_hosts"][0]["routes"] = snippet["routes"]
    doc["static_resources"]["clusters"].append(envoy_config.pool_cluster("fallback", [("127.0.0.1", 8002)]))
    doc["static_resources"]["clusters"] = [*snippet["clusters"], *doc["static_resources"]["clusters"][1:]]
    path = tmp_path / "with-include.yaml"
    path.write_text(envoy_config.dump(doc))
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_cli_help_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "extproc.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "check-config" in result.stdout


def test_semantic_profiles_override_only_what_they_name() -> None:
    from extproc.config import CacheSemantic, SemanticProfile

    base = CacheSemantic(embedder="minilm", target_precision=0.95)
    chosen = base.for_profile(SemanticProfile(tenant="cn", embedder="e5-small"))
    assert (chosen.embedder, chosen.target_precision, chosen.profiles) == ("e5-small", 0.95, [])
    off = base.for_profile(SemanticProfile(path_prefix="/v1/completions", enabled=False))
    assert (off.embedder, off.enabled) == ("minilm", False)
    profile = SemanticProfile(tenant="cn", path_prefix="/v1/chat")
    assert profile.applies("cn", "/v1/chat/completions")
    assert not profile.applies("cn", "/v1/completions") and not profile.applies("us", "/v1/chat/completions")


def test_alert_rules_name_only_metrics_the_gate_exports() -> None:
    import re

    import yaml

    from extproc.metrics import Metrics

    exported = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + s for s in suffixes}
    rules = yaml.safe_load((REPO / "deploy/alerts.yaml").read_text())["groups"][0]["rules"]
    assert rules
    for rule in rules:
        used = set(re.findall(r"\bgate_[a-z0-9_]+", rule["expr"]))
        assert used and used <= exported, (rule["alert"], used - exported)


def test_istio_routing_matches_every_default_pool_and_the_envoy_protection() -> None:
    import yaml

    from extproc.config import Routing

    docs = list(yaml.safe_load_all((REPO / "istio/envoyfilter.yaml").read_text()))
    service = next(d for d in docs if d["kind"] == "VirtualService")
    routes = service["spec"]["http"]
    matched = {
        m["headers"]["x-gate-cluster"]["exact"] for r in routes for m in r.get("match", []) if "headers" in m
    }
    assert matched == {pool.cluster for pool in Routing().pools.values()}
    # Only the allow-list passes untouched; no route catches every other path.
    assert all(r.get("match") for r in service["spec"]["http"])
    allowed = {(m["method"]["exact"], m["uri"]["exact"]) for m in service["spec"]["http"][-1]["match"]}
    assert allowed == {tuple(e.split()) for e in Routing().passthrough}
    envoy = yaml.safe_load((REPO / "envoy/envoy.yaml").read_text())
    primary = next(c for c in envoy["static_resources"]["clusters"] if c["name"] == "primary")
    outlier = primary["outlier_detection"]
    for rule in (d for d in docs if d["kind"] == "DestinationRule" and d["metadata"]["name"] != "llm-gate"):
        od = rule["spec"]["trafficPolicy"]["outlierDetection"]
        assert od["consecutive5xxErrors"] == outlier["consecutive_5xx"]
        assert od["consecutiveGatewayErrors"] == outlier["consecutive_gateway_failure"]


def test_a_hostname_makes_a_dns_cluster_that_envoy_accepts(tmp_path: Path) -> None:
    """A headless Service's name: STRICT_DNS, one endpoint per pod; addresses stay STATIC."""
    out = tmp_path / "envoy.yaml"
    assert envoy_config.main([
        "--gate", "llm-gate-headless.llm-gate.svc.cluster.local:50051",
        "--pool", "primary=vllm-primary.llm.svc.cluster.local:8000",
        "--pool", "fallback=127.0.0.1:8002",
        "--out", str(out),
    ]) == 0
    import yaml

    clusters = {c["name"]: c for c in yaml.safe_load(out.read_text())["static_resources"]["clusters"]}
    assert clusters["llm_gate"]["type"] == clusters["primary"]["type"] == "STRICT_DNS"
    assert clusters["fallback"]["type"] == "STATIC"
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(out), "--use-dynamic-base-id"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
