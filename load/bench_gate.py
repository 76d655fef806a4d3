"""Benchmark: Envoy alone vs Envoy + no-op ext_proc vs Envoy + the gate, same run, same load.

The upstream is a second Envoy listener with a fixed JSON answer, so the figures show
what the ext_proc hop and the gate's stages cost, not a model server's speed.
Needs `wrk` (apt-get install wrk). Writes load/results/bench_gate.md.

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
from pathlib import Path
from typing import Any

from extproc import envoy_config

from .stack import LOOPBACK, envoy_binary, free_port, wait_http, wait_port

BODY = (
    '{"model":"llama-3-8b","max_tokens":16,'
    '"messages":[{"role":"user","content":"What is the capital of France?"}]}'
)
ANSWER = (
    '{"id":"x","object":"chat.completion","model":"llama-3-8b","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}]}'
)
RESULTS = Path(__file__).parent / "results" / "bench_gate.md"
CLK_TCK = os.sysconf("SC_CLK_TCK")


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
    return {
        "name": "upstream",
        "address": {"socket_address": {"address": LOOPBACK, "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
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
    def ms(text: str) -> float:
        value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = ms(re.search(r"50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = ms(re.search(r"99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": rps,
        "p50": p50,
        "p99": p99,
        "requests": total,
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }


def run_variant(name: str, work: Path, args: argparse.Namespace) -> dict[str, float]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gate_ports: list[int] = []
        proc = None
        if name != "envoy only":
            workers = 2 if name.endswith("2 workers") else 1
            first = free_port()
            gate_ports = [first + i for i in range(workers)]
            if name.startswith("no-op"):
                cmd = [sys.executable, "-m", "load.noop_extproc", "--port", str(first)]
            else:
                cmd = [
                    sys.executable,
                    "-m",
                    "extproc.cli",
                    "serve",
                    "--port",
                    str(first),
                    "--workers",
                    str(workers),
                    "--metrics-port",
                    "0",
                ]
            proc = subprocess.Popen(
                cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(work / "ext.log", "ab")
            )
            procs.append(proc)
            for port in gate_ports:
                wait_port(port, 60, proc)
        listen, admin, upstream = free_port(), free_port(), free_port()
        doc = envoy_config.bootstrap(
            listen=(LOOPBACK, listen),
            admin=(LOOPBACK, admin),
            gate=[(LOOPBACK, p) for p in gate_ports],
            pools={"primary": [(LOOPBACK, upstream)], "fallback": [(LOOPBACK, upstream)]},
        )
        doc["static_resources"]["listeners"].append(upstream_listener(upstream))
        path = work / f"envoy-{len(os.listdir(work))}.yaml"
        path.write_text(envoy_config.dump(doc))
        procs.append(
            subprocess.Popen(
                [
                    envoy_binary(),
                    "-c",
                    str(path),
                    "--use-dynamic-base-id",
                    "--concurrency",
                    "2",
                    "--log-level",
                    "error",
                ],
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=open(work / "envoy.log", "ab"),
            )
        )
        try:
            wait_http(f"http://{LOOPBACK}:{admin}/ready", 30)
        except TimeoutError:
            print((work / "envoy.log").read_text()[-3000:], file=sys.stderr)
            raise
        script = work / "post.lua"
        script.write_text(
            f"wrk.method = 'POST'\nwrk.body = '{BODY}'\nwrk.headers['Content-Type'] = 'application/json'\n"
        )
        wrk = [
            "wrk",
            "-t1",
            f"-c{args.connections}",
            "-s",
            str(script),
            "--latency",
            f"http://{LOOPBACK}:{listen}/v1/chat/completions",
        ]
        subprocess.run([*wrk[:3], "-d2s", *wrk[3:]], capture_output=True, check=True)  # warm-up
        cpu_before = group_cpu_seconds(proc.pid) if proc else 0.0
        out = subprocess.run(
            [*wrk[:3], f"-d{args.duration}s", *wrk[3:]], capture_output=True, text=True, check=True
        ).stdout
        result = parse_wrk(out)
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
    variants = ["envoy only", "no-op ext_proc", "gate", "gate, 2 workers"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llm-gate-bench-") as tmp:
        for name in variants:
            r = run_variant(name, Path(tmp), args)
            rows.append((name, r))
            print(
                f"{name:18s} {r['rps']:8.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  "
                f"ext_proc CPU {r['cpu_ms_per_req']:.3f} ms/req  non-2xx {r['errors']:.0f}",
                flush=True,
            )
    base = rows[0][1]["rps"]
    lines = [
        f"# Gate overhead benchmark ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared machine)",
        "",
        f"`python -m load.bench_gate --duration {args.duration} --connections {args.connections}`: "
        "wrk, one thread, POST /v1/chat/completions (small chat body); "
        "the upstream is a fixed Envoy direct_response.",
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
