"""The alert rules load in Prometheus' own checker and each fires (or stays quiet) as its
`promtool test rules` case says (deploy/alerts_test.yaml)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: apt-get install prometheus (.ci/run does)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, cwd=REPO / "deploy")


def test_rules_are_valid_and_every_alert_has_a_passing_test_case() -> None:
    check = promtool("check", "rules", "alerts.yaml")
    assert check.returncode == 0, check.stdout + check.stderr
    test = promtool("test", "rules", "alerts_test.yaml")
    assert test.returncode == 0, test.stdout + test.stderr
    alerts = {r["alert"] for g in yaml.safe_load((REPO / "deploy/alerts.yaml").read_text())["groups"]
              for r in g["rules"]}
    tested = set(re.findall(r"alertname: (\w+)", (REPO / "deploy/alerts_test.yaml").read_text()))
    new = {"LLMGateAddedLatencyHigh", "LLMGateDown", "LLMGateEnvoyOverflow", "LLMGateExtProcStreamsFailing",
           "LLMGatePoolMemoryHigh", "LLMGatePoolLatencyHigh", "LLMGateInvalidRequestsOutOfBand",
           "LLMGateStoreDown"}
    assert new <= alerts and new <= tested


def test_envoy_metrics_the_alerts_watch_exist_in_a_real_envoy() -> None:
    import urllib.request

    import httpx

    from load.stack import Stack

    rules = yaml.safe_load((REPO / "deploy/alerts.yaml").read_text())["groups"]
    exprs = " ".join(r["expr"] for g in rules for r in g["rules"])
    patterns = re.findall(r'__name__=~"(envoy_[^"]+)"', exprs)
    named = set(re.findall(r"\benvoy_[a-z0-9_]+(?=[{\[])", exprs))  # metric names, not labels
    assert named or patterns
    with Stack(gate_config={"cache": {"semantic": {"enabled": False}}}) as stack:
        chat = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{stack.url}/v1/chat/completions", json=chat, timeout=10).status_code == 200
        url = f"http://127.0.0.1:{stack.admin_port}/stats/prometheus"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    series = {line.split("{")[0].split(" ")[0] for line in lines}
    for name in named:
        assert name in series, name
        if name.startswith("envoy_cluster_"):  # the alerts watch the gate's cluster
            assert any(line.startswith(f'{name}{{envoy_cluster_name="llm_gate"}}') for line in lines), name
    for pattern in patterns:
        assert any(re.fullmatch(pattern, name) for name in series), pattern
