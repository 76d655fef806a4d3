"""`python -m load.drill_rollout`: roll every gate process under steady load, 0 failed requests.

Through real Envoy with 2 gate workers: clients send a steady stream of chat requests while
each worker in turn gets SIGTERM (as a rolling update or a scale-down sends it). The worker
reports NOT_SERVING, keeps answering while Envoy's health checks move new streams to the
other worker (`server.drain_seconds`), lets its open streams finish, exits, and its
supervisor starts a new one, which must be serving before the next worker is rolled.
Writes load/results/drill_rollout.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .stack import Stack

HEADERS = {"authorization": "Bearer sk-rollout", "content-type": "application/json"}


@dataclass
class Result:
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    rolled: list[tuple[int, int]] = field(default_factory=list)  # (old pid, new pid)
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != 200) + sum(self.errors.values())


async def _load(url: str, stop: asyncio.Event, concurrency: int, result: Result) -> None:
    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=30) as c:
            n = 0
            while not stop.is_set():
                n += 1
                body = {"model": "llama-3-8b", "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"rollout client {i} request {n}"}]}
                try:
                    r = await c.post("/v1/chat/completions", json=body)
                    result.statuses[r.status_code] += 1
                except httpx.HTTPError as exc:
                    result.errors[type(exc).__name__] += 1

    await asyncio.gather(*(client(i) for i in range(concurrency)))


async def _wait_replaced(stack: Stack, index: int, old: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = stack.gate_worker_pids().get(index)
        if pid is not None and pid != old:
            return pid
        await asyncio.sleep(0.2)
    raise TimeoutError(f"gate worker {index} was not replaced within {timeout_s}s")


async def drill(stack: Stack, concurrency: int, settle_s: float) -> Result:
    result = Result()
    stop = asyncio.Event()
    started = time.monotonic()
    load = asyncio.ensure_future(_load(stack.url, stop, concurrency, result))
    await asyncio.sleep(settle_s)
    for index in range(len(stack.gate_ports)):
        old = stack.gate_worker_pids()[index]
        os.kill(old, signal.SIGTERM)
        new = await _wait_replaced(stack, index, old, 60)
        result.rolled.append((old, new))
        await asyncio.sleep(settle_s)  # Envoy's health check sees the new worker serving
    stop.set()
    await load
    result.seconds = time.monotonic() - started
    return result


def rollout_stack(drain_s: float) -> Stack:
    return Stack(gate_workers=2, gate_config={"server": {"drain_seconds": drain_s, "grace_seconds": 5}})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.drill_rollout", description=__doc__)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--drain-s", type=float, default=6.0)
    p.add_argument("--settle-s", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=Path("load/results/drill_rollout.md"))
    a = p.parse_args(argv)
    with rollout_stack(a.drain_s) as stack:
        result = asyncio.run(drill(stack, a.concurrency, a.settle_s))
    total = sum(result.statuses.values()) + sum(result.errors.values())
    text = (
        "# Rolling restart of the gate processes under load\n\n"
        f"`python -m load.drill_rollout --concurrency {a.concurrency} --drain-s {a.drain_s:g}`: 2 gate"
        " workers behind real Envoy, each sent SIGTERM in turn while clients keep sending.\n\n"
        "| requests | failed | workers rolled | seconds | result |\n|---:|---:|---:|---:|---|\n"
        f"| {total} | {result.failed} | {len(result.rolled)} | {result.seconds:.1f} |"
        f" {'PASS' if result.failed == 0 else 'FAIL'} |\n"
    )
    a.out.write_text(text)
    print(text, dict(result.statuses), dict(result.errors))
    return 0 if result.failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
