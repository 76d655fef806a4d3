"""Benchmark: Envoy alone vs Envoy + a no-op ext_proc vs Envoy + the gate, same run, same load.

The upstream is a second Envoy listener with a fixed JSON answer, so the figures show what
the ext_proc hop and the gate's stages cost, not a model server's speed. Needs `wrk`
(apt-get install wrk). Writes load/results/bench_gate.md.

    python -m load.bench_gate [--duration 10] [--connections 16]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc import envoy_config

from .stack import LOOPBACK, envoy_command, free_port, free_ports, wait_http, wait_port

RESULTS = Path(__file__).parent / "results" / "bench_gate.md"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ANSWER = (
    '{"id":"x","object":"chat.completion","model":"llama-3-8b","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}]}'
)
# wrk script: one fixed question, or a new question for every request (cache misses).
WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local q = %s
  local body = '{"model":"llama-3-8b","max_tokens":16,"messages":[{"role":"user","content":"' .. q .. '"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
"""
ONLY_VALIDATE_AND_ROUTE = {
    "ratelimit": {"enabled": False},
    "breaker": {"enabled": False},
    "cache": {"enabled": False},
    "admission": {"enabled": False},
}


@dataclass
class Variant:
    name: str
    ext_proc: str = "gate"  # none | noop | gate
    workers: int = 1
    config: dict[str, Any] = field(default_factory=dict)
    unique: bool = True  # a new question per request


VARIANTS = [
    Variant("Envoy alone", ext_proc="none"),
    Variant("no-op ext_proc (Python grpc.aio)", ext_proc="noop"),
    Variant("gate: identity, validation, routing", config=ONLY_VALIDATE_AND_ROUTE),
    Variant("gate: every stage, cache misses", config={}),
    Variant("gate: every stage, cache hits", config={}, unique=False),
    Variant("gate: validation + routing, 2 workers", workers=2, config=ONLY_VALIDATE_AND_ROUTE),
]


def upstream_listener(port: int) -> dict[str, Any]:
    route = {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": ANSWER}}}
    hcm = {
        "@type": envoy_config.HCM,
        "stat_prefix": "upstream",
        "route_config": {
            "virtual_hosts": [{"name": "u", "domains": ["*"], "routes": [route]}],
            "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
        },
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": {"@type": envoy_config.ROUTER}}
        ],
    }
    filters = [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
    return {
        "name": "upstream",
        "address": {"socket_address": {"address": LOOPBACK, "port_value": port}},
        "filter_chains": [{"filters": filters}],
    }


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in the process group."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def parse_wrk(out: str) -> dict[str, float]:
    def find(pattern: str) -> str:
        match = re.search(pattern, out)
        if match is None:
            raise ValueError(f"wrk output without {pattern!r}:\n{out}")
        return match.group(1)

    def ms(text: str) -> float:
        value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(find(r"Requests/sec:\s+([\d.]+)")),
        "p50": ms(find(r"50%\s+(\S+)")),
        "p99": ms(find(r"99%\s+(\S+)")),
        "requests": int(find(r"(\d+) requests in")),
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


def start_ext_proc(variant: Variant, work: Path) -> tuple[subprocess.Popen[bytes] | None, list[int]]:
    if variant.ext_proc == "none":
        return None, []
    first = free_ports(variant.workers)
    if variant.ext_proc == "noop":
        args = [sys.executable, "-m", "load.noop_extproc", "--port", str(first)]
    else:
        config = work / "gate.yaml"
        config.write_text(yaml.safe_dump(variant.config))
        args = [
            sys.executable,
            "-m",
            "extproc.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(first),
            "--workers",
            str(variant.workers),
            "--metrics-port",
            "0",
        ]
    proc = spawn(args, work / "ext_proc.log")
    ports = [first + i for i in range(variant.workers)]
    for port in ports:
        wait_port(port, 60, proc)
    return proc, ports


def run_variant(variant: Variant, work: Path, args: argparse.Namespace) -> dict[str, float]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        proc, gate_ports = start_ext_proc(variant, work)
        procs += [proc] if proc else []
        listen, admin, upstream = free_port(), free_port(), free_port()
        doc = envoy_config.bootstrap(
            listen=(LOOPBACK, listen),
            admin=(LOOPBACK, admin),
            gate=[(LOOPBACK, p) for p in gate_ports],
            pools={"primary": [(LOOPBACK, upstream)], "fallback": [(LOOPBACK, upstream)]},
            require_gate_route=variant.ext_proc != "noop",  # the no-op processor routes nothing
        )
        doc["static_resources"]["listeners"].append(upstream_listener(upstream))
        h2 = envoy_config.gate_cluster([])["typed_extension_protocol_options"]
        for cluster in doc["static_resources"]["clusters"]:
            # h2c to the fixed upstream: one multiplexed connection, not one per request
            # (HTTP/1.1 here left tens of thousands of loopback ports in TIME_WAIT)
            if cluster["name"] != envoy_config.GATE_CLUSTER:
                cluster["typed_extension_protocol_options"] = h2
        procs.append(spawn(envoy_command(doc, work / "envoy.yaml", "error"), work / "envoy.log"))
        wait_http(f"http://{LOOPBACK}:{admin}/ready", 30)
        question = (
            "'question ' .. counter .. ' of ' .. math.random(1e9)" if variant.unique else "'What is 2+2?'"
        )
        script = work / "post.lua"
        script.write_text(WRK_SCRIPT % question)
        url = f"http://{LOOPBACK}:{listen}/v1/chat/completions"
        wrk = ["wrk", "-t1", f"-c{args.connections}", "-s", str(script), "--latency"]
        subprocess.run([*wrk, "-d2s", url], capture_output=True, check=True)  # warm-up
        cpu_before = group_cpu_seconds(proc.pid) if proc else 0.0
        out = subprocess.run([*wrk, f"-d{args.duration}s", url], capture_output=True, text=True, check=True)
        result = parse_wrk(out.stdout)
        cpu = (group_cpu_seconds(proc.pid) - cpu_before) if proc else 0.0
        result["cpu_ms_per_req"] = 1000 * cpu / max(result["requests"], 1)
        return result
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is needed: apt-get install wrk", file=sys.stderr)
        return 2
    rows = []
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory(prefix="llm-gate-bench-") as tmp:
            r = run_variant(variant, Path(tmp), args)
        rows.append((variant.name, r))
        print(
            f"{variant.name:40s} {r['rps']:7.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  "
            f"ext_proc CPU {r['cpu_ms_per_req']:.3f} ms/req  non-2xx {r['errors']:.0f}",
            flush=True,
        )
    base = rows[0][1]["rps"]
    lines = [
        f"# Gate overhead ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores shared by wrk, Envoy, gate)",
        "",
        f"`python -m load.bench_gate --duration {args.duration} --connections {args.connections}`: wrk, one "
        "thread, POST /v1/chat/completions with a small chat body; the upstream is a fixed Envoy "
        "direct_response; Envoy with 2 worker threads.",
        "",
        "| variant | req/s | vs Envoy alone | p50 ms | p99 ms | ext_proc CPU ms/req | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['rps']:.0f} | {r['rps'] / base:.2f} | {r['p50']:.2f} | {r['p99']:.2f} | "
            f"{r['cpu_ms_per_req']:.3f} | {r['errors']:.0f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
