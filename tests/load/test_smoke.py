"""CI smoke test: a short seed-mix run through the real stack, then its report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from load import report
from load.loadgen import Options, Target, load_stack, run_load, write_run


def test_short_run_accounts_for_every_request_and_reports(tmp_path: Path) -> None:
    opts = Options(requests=300, seconds=15, rate=20, burst_every=5, burst_size=10, seed=3)
    with load_stack() as stack:
        target = Target.of(stack)
        pids = stack.gate_worker_pids()  # what the drills kill: one process per worker port
        assert sorted(pids) == [0, 1] and len(set(pids.values())) == 2
        run = asyncio.run(run_load(target, opts, tmp_path))
        write_run(tmp_path, opts, run, target)
    rows = report.read_jsonl(tmp_path / "requests.jsonl")
    assert len(rows) == len(run.rows) >= 200
    # Exact accounting: one complete answer per request (a 200 with its whole body or
    # [DONE], or a JSON error), and the simulators saw exactly the misses and bypasses.
    acc = report.accounting(rows, run.sims_before, run.sims_after)
    assert acc.incomplete == [], [r for r in rows if not r.get("complete")][:3]
    assert acc.sim_calls == acc.expected_calls > 0
    assert {r["tier"] for r in rows} == {"vip", "premium", "standard"}
    assert any(r["stream"] and r["status"] == 200 for r in rows)
    assert any(r["kind"].startswith("invalid") and 400 <= r["status"] < 500 for r in rows)
    assert any(r["cache"] in ("hit", "coalesced") for r in rows)  # repeats were saved
    scraped = report.read_jsonl(tmp_path / "metrics.jsonl")
    assert len(scraped) >= 5 and scraped[-1]["workers_up"] == 2
    assert json.loads((tmp_path / "run.json").read_text())["requests"] == len(rows)

    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    for section in ("## Headline", "## Latency by tier", "## Requests vs upstream calls",
                    "## Queue, sheds, breaker", "## Bypass share", "## Cost model", "## Safety"):
        assert section in md
    assert "Accounting: " in md and "holds" in md
    for png in ("latency_cdf.png", "traffic.png", "queue_breaker.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"]({png})" in md
