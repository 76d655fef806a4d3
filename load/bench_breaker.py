"""Benchmark: what the latency breaker costs.

1. The stage on the request path (choose + time + record), per request, in process.
2. One sync tick (share samples, read state, read the merged window) against a real
   redis-server, default window (60 s in 20 slices), two pools.
3. Streams through the real Envoy with `stream_signal: ttft` (response body streamed
   through the gate to time the first chunk) against `total` (no body stream).

Starts its own redis-server, simulators, gate and Envoy on free ports.
Writes load/results/bench_breaker.md.

    python -m load.bench_breaker [--requests 20000] [--streams 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx
import orjson

from extproc.breaker.monitor import Breakers
from extproc.config import Config, Store
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.redis_conn import connect
from extproc.stages.breaker import Breaker
from extproc.stages.route import Route

from .stack import RedisServer, Stack

RESULTS = Path(__file__).parent / "results" / "bench_breaker.md"
PAYLOAD = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hello"}]}


async def stage_cost(n: int) -> tuple[float, float]:
    """µs per request: Route alone, and Route + Breaker (all hooks)."""
    config = Config()
    route = Route(config.routing)
    breaker = Breaker(
        Breakers(config.breaker, config.routing.pools, Metrics()), config.routing, config.breaker, 16384
    )

    async def one(with_breaker: bool) -> None:
        ex = Exchange("POST", "/v1/chat/completions", {}, payload=dict(PAYLOAD))
        await route.on_request(ex)
        if with_breaker:
            await breaker.on_request(ex)
            ex.upstream_started = time.perf_counter()
            await breaker.on_response(ex, 200, {})
            await breaker.on_done(ex)

    out = []
    for with_breaker in (False, True):
        started = time.perf_counter()
        for _ in range(n):
            await one(with_breaker)
        out.append((time.perf_counter() - started) / n * 1e6)
    await breaker.breakers.close()
    return out[0], out[1]


async def sync_cost(url: str, ticks: int) -> list[float]:
    config = Config()
    client = connect(Store(redis_url=url, op_timeout_ms=250))
    gates = [Breakers(config.breaker, config.routing.pools, Metrics(), client) for _ in range(2)]
    times = []
    for i in range(ticks):
        for g in gates:
            for _ in range(20):  # ~40 req/s per process at 0.5 s ticks
                g.record("primary", g.version("primary"), 0.2 + (i % 10) / 10, error=False)
            started = time.perf_counter()
            await g.sync_once()
            times.append(time.perf_counter() - started)
    assert client is not None
    await client.aclose()
    return times


def streams(stack: Stack, n: int, concurrency: int) -> tuple[float, float, float]:
    """req/s, mean client latency (ms), mean gate busy time per request (ms)."""
    body = {**PAYLOAD, "stream": True, "max_tokens": 16}

    async def run() -> tuple[float, float]:
        latencies: list[float] = []
        queue = iter(range(n))
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:

            async def worker() -> None:
                for _ in queue:
                    started = time.perf_counter()
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for _chunk in r.aiter_bytes():
                            pass
                        assert r.status_code == 200
                    latencies.append(time.perf_counter() - started)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return n / (time.perf_counter() - started), statistics.mean(latencies) * 1000

    rps, mean_ms = asyncio.run(run())
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics").text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("gate_added_latency_seconds_")
    }
    busy = values["gate_added_latency_seconds_sum"] / values["gate_added_latency_seconds_count"] * 1000
    return rps, mean_ms, busy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.bench_breaker")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)

    route_us, breaker_us = asyncio.run(stage_cost(args.requests))
    server = RedisServer().start()
    try:
        ticks = sorted(asyncio.run(sync_cost(server.url, args.ticks)))
    finally:
        server.kill()
    rows = []
    for signal in ("total", "ttft"):
        config = {"breaker": {"stream_signal": signal}, "ratelimit": {"enabled": False}}
        with Stack(gate_config=config) as stack:
            streams(stack, 20, 4)  # warm up
            rows.append((signal, *streams(stack, args.streams, args.concurrency)))

    lines = [
        "# Latency breaker: cost",
        "",
        f"`python -m load.bench_breaker --requests {args.requests} --ticks {args.ticks} "
        f"--streams {args.streams} --concurrency {args.concurrency}` on this machine (2 shared cores).",
        "",
        "| what | value |",
        "|---|---|",
        f"| Route stage alone, per request | {route_us:.1f} µs |",
        f"| Route + Breaker (choose, time, record), per request | {breaker_us:.1f} µs |",
        f"| breaker's own cost per request | {breaker_us - route_us:.1f} µs |",
        f"| sync tick, 2 pools, real Redis: median | {statistics.median(ticks) * 1000:.2f} ms |",
        f"| sync tick: p99 | {ticks[int(len(ticks) * 0.99) - 1] * 1000:.2f} ms |",
        "",
        "Streams through Envoy (16 tokens, itl 5 ms), one gate process:",
        "",
        "| stream_signal | req/s | mean latency | gate busy per request |",
        "|---|---|---|---|",
        *(f"| {s} | {rps:.0f} | {ms:.0f} ms | {busy:.2f} ms |" for s, rps, ms, busy in rows),
        "",
        "`ttft` streams every response chunk through the gate (one ext_proc message each);",
        "`total` reads the end of the stream from `on_done` at no extra cost.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(orjson.dumps({"route_us": route_us, "breaker_us": breaker_us}).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
