"""Benchmark: what one rate-limit check costs, in memory and in a real Redis (one Lua call).

Each check is what the gate runs per request with every limit on: tenant, user, IP and
route buckets plus the repeated-prompt window. Also counts, under full load from two
clients on one bucket, how many requests were admitted against the GCRA bound.
Starts its own redis-server on a free port. Writes load/results/bench_ratelimit.md.

    python -m load.bench_ratelimit [--checks 5000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from extproc.ratelimit.check import BucketSpec, Check, RepeatSpec
from extproc.ratelimit.store import LimitStore, MemoryStore, RedisStore

from .stack import RedisServer

RESULTS = Path(__file__).parent / "results" / "bench_ratelimit.md"


def full_check(i: int) -> Check:
    """Distinct callers and prompts, so nothing is limited and every bucket is written."""
    user, prompt = i % 500, i
    buckets = (
        BucketSpec("tenant", f"b:t:tenant{i % 10}", 1e6, 1000),
        BucketSpec("user", f"b:u:tenant{i % 10}:user{user}", 1e6, 1000),
        BucketSpec("ip", f"b:ip:10.0.{user // 250}.{user % 250}", 1e6, 1000),
        BucketSpec("route", "b:r:/v1/chat/completions", 1e6, 10**6),
    )
    repeat = RepeatSpec(f"b:rep:user{user}:{prompt}", f"b:block:user{user}", 10, 1_000_000, 60_000_000)
    return Check(buckets, repeat)


async def latencies(store: LimitStore, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        await store.check(full_check(i))
        out.append(time.perf_counter() - started)
    return out


async def throughput(store: LimitStore, n: int, concurrency: int) -> float:
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            await store.check(full_check(i))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - started)


async def admitted_under_load(url: str, seconds: float, rate: float, burst: int) -> tuple[int, float, float]:
    clients = [aioredis.Redis.from_url(url) for _ in range(2)]
    stores = [RedisStore(c) for c in clients]
    check = Check((BucketSpec("tenant", f"load:{uuid.uuid4().hex}", rate, burst),))
    admitted = 0
    started = time.perf_counter()

    async def hammer(store: RedisStore) -> None:
        nonlocal admitted
        while time.perf_counter() - started < seconds:
            if (await store.check(check)).status == "allowed":
                admitted += 1

    await asyncio.gather(*(hammer(stores[i % 2]) for i in range(16)))
    elapsed = time.perf_counter() - started
    for c in clients:
        await c.aclose()
    return admitted, elapsed, rate * elapsed + burst


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e6


async def run(args: argparse.Namespace, url: str) -> str:
    client = aioredis.Redis.from_url(url)
    rows = []
    for name, store in (("memory", MemoryStore()), ("redis (Lua, 1 round trip)", RedisStore(client))):
        await latencies(store, 200)  # warm up (EVALSHA cache, connections)
        lat = await latencies(store, args.checks)
        ops = await throughput(store, args.checks, args.concurrency)
        rows.append(f"| {name} | {statistics.median(lat) * 1e6:.0f} | {pct(lat, 0.99):.0f} | {ops:,.0f} |")
    await client.aclose()
    admitted, elapsed, bound = await admitted_under_load(url, 3.0, 50, 20)
    return "\n".join(
        [
            f"# Rate-limit check benchmark ({time.strftime('%Y-%m-%d')}, 2 cores, shared machine)",
            "",
            f"`python -m load.bench_ratelimit --checks {args.checks} --concurrency {args.concurrency}`: "
            "one check = 4 GCRA buckets + the repeated-prompt window, as the gate runs per request.",
            "",
            f"| store | p50 µs (sequential) | p99 µs | checks/s ({args.concurrency} concurrent) |",
            "|---|---:|---:|---:|",
            *rows,
            "",
            f"Two clients, 16 tasks, one bucket (50/s, burst 20) for {elapsed:.2f} s: "
            f"{admitted} admitted; the GCRA bound rate × time + burst is {bound:.1f}.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_ratelimit", description=__doc__)
    parser.add_argument("--checks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    server = RedisServer().start()
    try:
        text = asyncio.run(run(args, server.url))
    finally:
        server.kill()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
