"""`python -m load.bench_redis_ops`: Redis operations and Redis CPU per request, by cache path.

Starts the stack (2 gate processes, real Envoy, a simulator, one redis-server) with rate
limits on the tenant and the user, the semantic cache (e5-small) and self-calibration on
(the defaults), then sends a fixed number of requests per path and reads what Redis saw:

  miss       N distinct questions, one at a time (each computed upstream, then stored)
  hit        the same N questions again (each an exact hit)
  coalesced  G groups of K identical new questions sent at once while the upstream is slow:
             1 leader + K-1 that wait for its answer

Operations are counted with MONITOR (client commands, and the commands the Lua scripts
run), apart from the gate's background work (the breaker's sync every 0.5 s per process),
which is measured while idle and reported per second. Redis CPU (INFO cpu, user + sys)
per request is measured in a second pass without MONITOR, the idle CPU subtracted.
Writes load/results/bench_redis_ops.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import redis

from .loadgen import LOAD_CONFIG
from .mix import LOAD_IDENTITY
from .stack import Stack

CHAT = "/v1/chat/completions"
HEADERS = {"authorization": "Bearer sk-load-std-0", "content-type": "application/json", "x-user-id": "bench"}
CONFIG: dict[str, Any] = {
    "identity": LOAD_IDENTITY,
    "ratelimit": {"tiers": {"standard": {"tenant": {"rate": 10_000, "burst": 10_000},
                                         "user": {"rate": 10_000, "burst": 10_000}}}},
    "cache": LOAD_CONFIG["cache"],
}
LINE = re.compile(r'^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"(.*)$')
BACKGROUND = ("gate:breaker:",)
Work = Callable[[], Coroutine[Any, Any, Any]]


def question() -> str:
    return f"Please explain item {uuid.uuid4().hex[:10]} of the {uuid.uuid4().hex[:6]} catalogue"


async def ask(s: aiohttp.ClientSession, url: str, text: str, max_tokens: int = 16) -> str:
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    async with s.post(url + CHAT, json=body, headers=HEADERS, timeout=aiohttp.ClientTimeout(total=60)) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{r.status} for {text!r}")
        return r.headers.get("x-gate-cache", "")


class Counted:
    """What Redis ran while `work` ran: client commands and script commands, by name."""

    def __init__(self, port: int) -> None:
        self.port = port

    def monitor(self, work: Work, path: Path) -> tuple[Any, Counter[str], float]:
        with open(path, "w") as out:
            proc = subprocess.Popen(["redis-cli", "-p", str(self.port), "monitor"], stdout=out)
            time.sleep(0.5)
            started = time.monotonic()
            result: Any = asyncio.run(work())
            elapsed = time.monotonic() - started
            time.sleep(0.3)
            proc.terminate()
            proc.wait(5)
        counts: Counter[str] = Counter()
        for line in path.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if m is None:
                continue
            where = "lua" if m.group(1) == "lua" else "client"
            if any(b in m.group(3) for b in BACKGROUND):
                where = "background " + where
            counts[f"{where} {m.group(2).upper()}"] += 1
        return result, counts, elapsed

    def cpu(self, work: Work) -> tuple[Any, float, float]:
        r = redis.Redis(port=self.port)
        before = _cpu(r)
        started = time.monotonic()
        result: Any = asyncio.run(work())
        return result, _cpu(r) - before, time.monotonic() - started


def _cpu(r: redis.Redis) -> float:
    info: dict[str, Any] = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def per_request(counts: Counter[str], n: int) -> dict[str, float]:
    return {k: round(v / n, 2) for k, v in sorted(counts.items()) if not k.startswith("background")}


def totals(counts: Counter[str], n: int) -> tuple[float, float]:
    client = sum(v for k, v in counts.items() if k.startswith("client"))
    lua = sum(v for k, v in counts.items() if k.startswith("lua"))
    return client / n, lua / n


def run(n: int, groups: int, k: int, semantic: bool) -> dict[str, Any]:
    config = CONFIG if semantic else {**CONFIG, "cache": {"semantic": {"enabled": False}}}
    stack = Stack(gate_config=config, gate_workers=2, with_redis=True, sim_args=["--itl-ms", "40"])
    doc: dict[str, Any] = {"n": n, "groups": groups, "k": k, "semantic": semantic, "paths": {}}
    with stack:
        url = stack.url
        c = Counted(stack.redis_port)
        work = stack.workdir / "monitor.log"

        async def warm() -> None:
            async with aiohttp.ClientSession() as s:
                for _ in range(5):
                    q = question()
                    await ask(s, url, q)
                    await ask(s, url, q)

        asyncio.run(warm())

        async def idle() -> None:
            await asyncio.sleep(10)

        _, idle_counts, idle_s = c.monitor(idle, work)
        _, idle_cpu, idle_cpu_s = c.cpu(idle)
        doc["idle"] = {"ops_per_s": round(sum(idle_counts.values()) / idle_s, 1),
                       "by_command_per_s": {k: round(v / idle_s, 2) for k, v in sorted(idle_counts.items())},
                       "cpu_ms_per_s": round(idle_cpu / idle_cpu_s * 1000, 3)}

        def pass_of(kind: str) -> tuple[Callable[[], Coroutine[Any, Any, Counter[str]]], int]:
            qs = [question() for _ in range(n)]

            async def misses() -> Counter[str]:
                async with aiohttp.ClientSession() as s:
                    return Counter([await ask(s, url, q) for q in qs])

            async def hits() -> Counter[str]:
                async with aiohttp.ClientSession() as s:
                    return Counter([await ask(s, url, q) for q in qs])

            async def coalesced() -> Counter[str]:
                seen: Counter[str] = Counter()
                async with aiohttp.ClientSession() as s:
                    for _ in range(groups):
                        q = question()
                        seen.update(await asyncio.gather(*(ask(s, url, q, max_tokens=25) for _ in range(k))))
                return seen

            if kind == "hit":
                asyncio.run(misses())  # store them first
                return hits, n
            if kind == "miss":
                return misses, n
            return coalesced, groups * k

        for kind in ("miss", "hit", "coalesced"):
            work_fn, count = pass_of(kind)
            answers, counts, seconds = c.monitor(work_fn, work)
            work_fn, _ = pass_of(kind)
            _, cpu, cpu_s = c.cpu(work_fn)
            client, lua = totals(counts, count)
            # Background commands (breaker sync) are filtered out; idle CPU is not: subtract it.
            cpu_ms = (cpu - idle_cpu / idle_cpu_s * cpu_s) * 1000 / count
            doc["paths"][kind] = {"requests": count, "answers": dict(answers), "client_ops": round(client, 2),
                                  "script_ops": round(lua, 2), "by_command": per_request(counts, count),
                                  "redis_cpu_ms": round(cpu_ms, 4), "seconds": round(seconds, 1)}
        work.unlink(missing_ok=True)
    # The coalesced groups hold one leader each (a miss): what each follower sent on its own.
    # (Script ops and CPU of a miss grow with what the scope's index holds, so only the
    # client commands, which do not, are split this way.)
    miss, co = doc["paths"]["miss"], doc["paths"]["coalesced"]
    co["per_follower_client_ops"] = round(
        (co["client_ops"] * co["requests"] - miss["client_ops"] * groups) / (groups * (k - 1)), 2)
    return doc


def write(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Redis operations per request (`python -m load.bench_redis_ops`), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "2 gate processes, real Envoy, one redis-server on loopback; rate limits on tenant and user, "
             + ("semantic cache (e5-small) and self-calibration on" if doc["semantic"] else
                "exact cache only (cache.semantic.enabled: false)") + ". Client ops: commands the gate sends "
             "(a pipeline's commands each count); script ops: commands its Lua scripts run inside Redis.", "",
             "| path | requests | answers | client ops / req | script ops / req | Redis CPU ms / req |",
             "|---|---:|---|---:|---:|---:|"]
    for kind, p in doc["paths"].items():
        lines.append(f"| {kind} | {p['requests']} | {p['answers']} | {p['client_ops']} | {p['script_ops']} "
                     f"| {p['redis_cpu_ms']} |")
    lines += ["", "Coalesced, each follower alone (the group's client ops less one miss for its leader): "
              f"{doc['paths']['coalesced']['per_follower_client_ops']} client ops."]
    idle = doc["idle"]
    lines += ["", f"Idle, 2 gate processes (the breaker's sync, 0.5 s): {idle['ops_per_s']} ops/s, "
              f"{idle['cpu_ms_per_s']} ms of Redis CPU per second: "
              + ", ".join(f"{k} {v}" for k, v in idle["by_command_per_s"].items()),
              "", "By command, per request:", ""]
    for kind, p in doc["paths"].items():
        lines.append(f"- {kind}: " + ", ".join(f"{k} {v}" for k, v in p["by_command"].items()))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.bench_redis_ops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="requests per path (miss, hit)")
    p.add_argument("--groups", type=int, default=30, help="coalesced: groups of identical requests")
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--exact-only", action="store_true", help="semantic cache off (exact keys only)")
    p.add_argument("--out", type=Path, help="default load/results/bench_redis_ops[_exact]")
    a = p.parse_args(argv)
    out = a.out or Path("load/results/bench_redis_ops" + ("_exact" if a.exact_only else ""))
    doc = run(a.requests, a.groups, a.group_size, not a.exact_only)
    write(doc, out)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
