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
           "LLMGatePoolMemoryHigh", "LLMGatePoolLatencyHigh", "LLMGateInvalidRequestsOutOfBand"}
    assert new <= alerts and new <= tested
