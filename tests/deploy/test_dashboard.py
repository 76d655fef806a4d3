"""The Grafana dashboard: every query names metrics the gate exports (extproc/metrics.py), and
it covers what an operator looks for."""

from __future__ import annotations

import json
import re
from pathlib import Path

from extproc.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/dashboards/llm-gate.json"


def exported() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + s for s in suffixes}
    return names


def queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def test_every_query_names_only_metrics_the_gate_exports() -> None:
    known = exported()
    found = queries()
    assert len(found) >= 15
    for title, expr in found:
        used = set(re.findall(r"\bgate_[a-z0-9_]+", expr))
        assert used, (title, expr)
        assert used <= known, (title, used - known)


def test_the_dashboard_covers_decisions_savings_queue_breaker_store_and_latency() -> None:
    text = " ".join(expr for _, expr in queries())
    for metric in ("gate_requests_total", "gate_cache_requests_total", "gate_queue_length",
                   "gate_queue_sheds_total", "gate_breaker_status", "gate_store_errors_total",
                   "gate_admission_wait_seconds_bucket", "gate_own_latency_seconds_bucket"):
        assert metric in text, metric
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "llm-gate"
