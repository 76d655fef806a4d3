"""The benchmark's wrk parser reads each figure from its own line."""

from __future__ import annotations

import pytest

from load.bench_gate import parse_wrk

WRK = """Running 10s test @ http://127.0.0.1:10000/v1/chat/completions
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.21ms    1.02ms  21.50ms   88.50%
    Req/Sec     5.01k   250.00     5.50k    50.50%
  Latency Distribution
     50%    3.05ms
     75%    3.60ms
     90%    4.20ms
     99%  750.00us
  49876 requests in 10.00s, 12.34MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   4987.10
Transfer/sec:      1.23MB
"""


def test_figures_come_from_their_own_lines_even_when_a_stdev_ends_in_50_percent() -> None:
    r = parse_wrk(WRK)
    assert r == {"rps": 4987.10, "p50": 3.05, "p99": 0.75, "requests": 49876, "errors": 3}


def test_seconds_and_no_errors() -> None:
    r = parse_wrk(
        WRK.replace("     50%    3.05ms", "     50%    1.50s").replace("  Non-2xx or 3xx responses: 3\n", "")
    )
    assert r["p50"] == 1500.0 and r["errors"] == 0


def test_output_without_a_distribution_is_an_error_not_a_wrong_figure() -> None:
    broken = "\n".join(line for line in WRK.splitlines() if "50%    3.05ms" not in line)
    with pytest.raises(ValueError, match="50%"):
        parse_wrk(broken)
