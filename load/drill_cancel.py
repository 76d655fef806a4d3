"""`python -m load.drill_cancel`: requests cancelled at random points leave nothing behind.

Through real Envoy, 2 gate workers and Redis: many requests for a few hot questions, each
abandoned by its client after a random time (so Envoy resets its stream, and the gate's request
is cancelled wherever it is: in a store lookup, following a leader, leading, queued, streaming).
The model is far slower than every client's patience (3 s against at most 0.4 s, so a close
noticed late still lands no answer), so every question stays contested. Then each question is
asked again by patient clients, several times (every worker gets it): each must be answered
within `--max-s` (a question wedged in a worker waits out its follower time-out: 10.08 s here
before the fix), and no lease may be left in Redis.
Writes load/results/drill_cancel.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from .stack import Stack

HEADERS = {"authorization": "Bearer sk-drill", "content-type": "application/json"}
MODEL_MS = 3000  # the model's time while clients give up; handler cancellation ends it early


def ask(question: str) -> dict[str, object]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": question}], "max_tokens": 8}


@dataclass
class Result:
    cancelled: int = 0
    answered_early: int = 0
    # How each early answer came (cache header, simulator, seconds): the drill's premise failed.
    early: list[tuple[str, str, float]] = field(default_factory=list)
    later_s: list[float] = field(default_factory=list)
    later_status: list[int] = field(default_factory=list)
    leases_left: int = 0

    def passed(self, max_s: float) -> bool:
        return (
            bool(self.later_s)
            and max(self.later_s) <= max_s
            and set(self.later_status) == {200}
            and self.leases_left == 0
        )


async def _impatient(client: httpx.AsyncClient, question: str, patience_s: float, result: Result) -> None:
    try:
        r = await client.post("/v1/chat/completions", json=ask(question), timeout=patience_s)
        result.answered_early += r.status_code == 200
        how = (r.headers.get("x-gate-cache", ""), r.headers.get("x-sim-name", ""), r.elapsed.total_seconds())
        result.early.append(how)
    except httpx.TimeoutException:
        result.cancelled += 1


async def drill(stack: Stack, requests: int, questions: int, concurrency: int, seed: int) -> Result:
    rng = random.Random(seed)
    hot = [f"Hot question number {i}: how do I rotate my access keys?" for i in range(questions)]
    result = Result()
    sims = [stack.sim_url(p) for p in stack.pool_ports]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=stack.url, headers=HEADERS, limits=limits) as client:
        for sim in sims:  # slower than any client's patience: nothing completes
            r = await client.post(sim + "/admin/faults", json={"extra_latency_ms": MODEL_MS})
            assert r.json()["extra_latency_ms"] == MODEL_MS, r.text
        left = iter(range(requests))

        async def worker() -> None:  # `concurrency` clients, each taking the next request
            for _ in left:
                await _impatient(client, rng.choice(hot), rng.uniform(0.001, 0.4), result)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        for sim in sims:
            (await client.post(sim + "/admin/faults", json={"extra_latency_ms": 0})).raise_for_status()
        await asyncio.sleep(0.5)  # cancelled upstream calls finish unwinding
        for question in hot:
            for _ in range(2 * len(stack.gate_ports) + 2):
                started = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=ask(question), timeout=60)
                result.later_s.append(time.perf_counter() - started)
                result.later_status.append(r.status_code)
    assert stack.redis_port
    with redis.Redis(port=stack.redis_port) as store:
        result.leases_left = sum(1 for _ in store.scan_iter(match="*l:*"))
    return result


def report(result: Result, requests: int, questions: int, max_s: float) -> str:
    return "\n".join(
        [
            "# Cancellation drill",
            "",
            f"`python -m load.drill_cancel --requests {requests} --questions {questions}`: 2 gate workers,"
            " Redis, real Envoy; every client gives up after a random 1-400 ms while the model takes"
            f" {MODEL_MS} ms.",
            "",
            "| requests | cancelled by their client | then asked again | slowest later answer"
            " | leases left | result |",
            "|---:|---:|---:|---:|---:|---|",
            f"| {requests} | {result.cancelled} | {len(result.later_s)} | {max(result.later_s):.3f} s"
            f" | {result.leases_left} | {'PASS' if result.passed(max_s) else 'FAIL'} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.drill_cancel", description=__doc__)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-s", type=float, default=1.0, help="slowest allowed later answer")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("load/results/drill_cancel.md"))
    a = p.parse_args(argv)
    with Stack(gate_workers=2, with_redis=True) as stack:
        result = asyncio.run(drill(stack, a.requests, a.questions, a.concurrency, a.seed))
    text = report(result, a.requests, a.questions, a.max_s)
    a.out.write_text(text)
    print(text)
    return 0 if result.passed(a.max_s) else 1


if __name__ == "__main__":
    raise SystemExit(main())
