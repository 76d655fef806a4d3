"""`python -m load.drill_redis sentinel|cluster|migrate|outage`: the shared store fails under load.

Each drill starts its own Redis topology and the stack (2 gate processes, real Envoy, two
simulators) with `store.redis` pointing at it, runs steady closed-loop load of valid chat
requests and, beside it, one rate-limited caller (LIMITED_KEY: 1/s, burst 5) sending 4
requests a second to `/v1/completions`, a path that fails closed (503) while the store is
down. Then:

  sentinel  SIGKILL the Sentinel master (1 master + 2 replicas + 3 sentinels)
  cluster   SIGKILL the Cluster master (of 3, each with a replica) holding the limited
            caller's bucket
  migrate   move live, one after the other, the Cluster slots of the limited caller's
            bucket and of every cache scope in use to another master
  outage    make a single Redis unreachable for 30 s (SIGSTOP: calls hang, as behind a
            dead network), then bring it back (SIGCONT)

Checks: 0 failed chat requests; 0 wrong answers (a cached answer of another question);
the limited caller admitted at most 1.1 x (rate x time + burst) and answered only 200,
429 or (while the store is down) 503; cache answers back within 5 s of the promotion or
the store's return; no lease left in the store at the end. Results go to
load/results/drill_redis_<name>.md (and .json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis

from .drills import Outcome, Sizes, under_load
from .loadgen import LOAD_CONFIG
from .mix import LIMITED, LIMITED_KEY
from .redis_topology import ClusterGroup, SentinelGroup, wait_until
from .stack import Stack

KINDS = ("sentinel", "cluster", "migrate", "outage")
LIMITED_PATH = "/v1/completions"
LIMITED_HZ = 4.0
RESUME_S = 5.0
OUTAGE_S = 30.0
RESULTS = Path("load/results")


@dataclass
class Drill:
    name: str
    sizes: Sizes
    out: Outcome = field(init=False)
    limited: list[tuple[float, int]] = field(default_factory=list)  # (t from start, status)
    odd: list[str] = field(default_factory=list)  # the first unexpected answers to the limited caller
    event_t: float | None = None  # the promotion, the last slot moved, the store's return
    topology: Any = None
    stack: Stack | None = None

    def __post_init__(self) -> None:
        self.out = Outcome(f"redis_{self.name}")


def bucket_key() -> str:
    from extproc.ratelimit.store import tagged

    return tagged("gate:rl:", "u", "limited", "u-limited", LIMITED_PATH)


async def limited_caller(url: str, t0: float, stop: asyncio.Event, into: list[tuple[float, int]],
                         odd: list[str]) -> None:
    headers = {"authorization": f"Bearer {LIMITED_KEY}", "content-type": "application/json",
               "x-business-scene": "drill"}
    first = time.monotonic()
    async with aiohttp.ClientSession() as s:
        i = 0
        while not stop.is_set():
            body = {"model": "llama-3-8b", "prompt": f"limited caller, request {i}", "max_tokens": 8}
            sent = time.monotonic() - t0
            try:
                async with s.post(url + LIMITED_PATH, json=body, headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=30)) as r:
                    text = await r.text()
                    into.append((sent, r.status))
                    if r.status not in (200, 429, 503) and len(odd) < 3:
                        odd.append(f"{r.status}: {text[:200]}")
            except (aiohttp.ClientError, TimeoutError):
                into.append((sent, 0))
            i += 1
            await asyncio.sleep(max(0.0, first + i / LIMITED_HZ - time.monotonic()))


def start(d: Drill) -> Stack:
    extra: dict[str, Any] = {"ratelimit": {**LOAD_CONFIG["ratelimit"], "fail_closed_paths": [LIMITED_PATH]}}
    if d.name == "sentinel":
        d.topology = SentinelGroup().start()
        extra["store"] = {"redis": d.topology.store_config()}
    elif d.name in ("cluster", "migrate"):
        d.topology = ClusterGroup().start()
        extra["store"] = {"redis": d.topology.store_config()}
    stack = Stack(gate_config={**LOAD_CONFIG, **extra}, gate_workers=2, with_redis=d.name == "outage")
    d.stack = stack.start()
    return stack


def client(d: Drill) -> Any:
    if d.name == "outage":
        assert d.stack is not None
        return redis.Redis(port=d.stack.redis_port)
    if d.name == "sentinel":
        return redis.Redis(port=d.topology.master_port())
    return redis.RedisCluster(host="127.0.0.1", port=next(iter(d.topology.masters())))


def fault(d: Drill, t0: float) -> None:
    """Runs in a thread; sets `event_t` (seconds from t0) and the drill's facts."""
    facts = d.out.facts
    if d.name == "sentinel":
        old = d.topology.kill_master()
        new = d.topology.wait_promoted(old)
        d.event_t = time.monotonic() - t0
        facts.append(f"Sentinel master :{old} SIGKILLed at {d.sizes.fault_at:.0f} s; :{new} promoted "
                     f"{d.event_t - d.sizes.fault_at:.1f} s later")
    elif d.name == "cluster":
        victim = d.topology.master_of(bucket_key())
        d.topology.kill(victim)
        wait_until(lambda: victim not in d.topology.masters() and len(d.topology.masters()) == 3, 30,
                   "a replica promoted")
        d.event_t = time.monotonic() - t0
        facts.append(f"Cluster master :{victim} SIGKILLed at {d.sizes.fault_at:.0f} s; its replica promoted "
                     f"{d.event_t - d.sizes.fault_at:.1f} s later")
    elif d.name == "migrate":
        c = client(d)
        scopes = {k.decode().split("}")[0] + "}" for k in c.scan_iter(match="gate:c:{*}:z", count=1000)}
        moved = []
        for key in [bucket_key(), *sorted(scopes)]:
            slot, src, dst = d.topology.migrate_slot_of(key)
            moved.append(f"{slot} (:{src} -> :{dst})")
        d.event_t = time.monotonic() - t0
        facts.append(f"{len(moved)} slots moved live from {d.sizes.fault_at:.0f} s to {d.event_t:.1f} s: "
                     + ", ".join(moved[:6]) + (" ..." if len(moved) > 6 else ""))
    else:
        assert d.stack is not None
        pid = d.stack.procs["redis"].pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(OUTAGE_S / 2)
        during = store_up(d.stack)
        time.sleep(OUTAGE_S / 2)
        os.kill(pid, signal.SIGCONT)
        d.event_t = time.monotonic() - t0
        time.sleep(RESUME_S)
        after = store_up(d.stack)
        facts.append(f"Redis unreachable (SIGSTOP) from {d.sizes.fault_at:.0f} s for {OUTAGE_S:.0f} s, "
                     f"back at {d.event_t:.1f} s; gate_store_up per worker: {during} halfway, "
                     f"{after} {RESUME_S:.0f} s after")
        d.out.checks += [("gate_store_up 0 on every worker during the outage", set(during) == {0.0}),
                         (f"gate_store_up 1 on every worker {RESUME_S:.0f} s after", set(after) == {1.0})]


def store_up(stack: Stack) -> list[float]:
    """gate_store_up of each gate worker, as its metrics port says now."""
    values = []
    for port in stack.metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            line = next(x for x in r.read().decode().splitlines() if x.startswith("gate_store_up "))
        values.append(float(line.split()[1]))
    return values


async def run(d: Drill) -> None:
    assert d.stack is not None
    stop = asyncio.Event()
    t0 = time.monotonic()
    caller = asyncio.ensure_future(limited_caller(d.stack.url, t0, stop, d.limited, d.odd))

    async def inject(_: float) -> None:
        await asyncio.to_thread(fault, d, t0)

    seconds = d.sizes.seconds + (OUTAGE_S if d.name == "outage" else 0.0)
    d.out.rows, d.out.fault_t = await under_load(d.stack, d.sizes, inject, seconds=seconds)
    stop.set()
    await caller
    await asyncio.sleep(0.5)
    leases = list(client(d).scan_iter(match="gate:c:{*}:l:*", count=1000))
    judge(d, len(leases))


def judge(d: Drill, leases_left: int) -> None:
    out, event = d.out, d.event_t or 0.0
    chat = out.rows
    wrong = [r for r in chat if r.get("status") == 200 and r.get("cache") in ("hit", "coalesced")
             and r.get("answer_family") and r["answer_family"] != r["family"]]
    bypass = [r["t"] for r in chat if r.get("cache") == "bypass"]
    late_bypass = [t for t in bypass if t > event + RESUME_S]
    span = (d.limited[-1][0] - d.limited[0][0]) if d.limited else 0.0
    admitted = sum(1 for _, s in d.limited if s == 200)
    bound = 1.1 * (LIMITED["rate"] * span + LIMITED["burst"])
    statuses = Counter(s for _, s in d.limited)
    odd = {s: n for s, n in statuses.items() if s not in (200, 429, 503)}
    late_503 = [t for t, s in d.limited if s == 503 and t > event + RESUME_S]
    out.facts += [
        f"chat requests {len(chat)}: cache answers {Counter(r.get('cache') for r in chat)}; "
        f"bypass (store skipped) {len(bypass)}, last at {max(bypass, default=0):.1f} s",
        f"limited caller over {span:.1f} s: {dict(statuses)}; admitted {admitted}, bound "
        f"1.1 x ({LIMITED['rate']:g}/s x {span:.1f} s + {LIMITED['burst']}) = {bound:.1f}",
    ]
    out.facts += [f"limited caller answered {o}" for o in d.odd]
    out.checks += [
        ("0 failed chat requests", not out.failed),
        (f"0 wrong answers ({len(wrong)})", not wrong),
        (f"limited caller admitted {admitted} <= {bound:.1f}", admitted <= bound),
        (f"limited caller got only 200, 429 or 503 ({odd or 'yes'})", not odd),
        (f"cache back within {RESUME_S:.0f} s of t={event:.1f} s ({len(late_bypass)} bypass after)",
         not late_bypass),
        (f"limits back within {RESUME_S:.0f} s ({len(late_503)} 503 after)", not late_503),
        (f"no lease left in the store ({leases_left})", leases_left == 0),
    ]


def write(d: Drill, results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (f"# Drill redis {d.name} (`python -m load.drill_redis {d.name}`), {stamp}\n\n"
            f"Steady load: {d.sizes.concurrency} concurrent chat requests for {d.sizes.seconds:.0f} s"
            f"{f' + {OUTAGE_S:.0f} s' if d.name == 'outage' else ''}, fault at {d.sizes.fault_at:.0f} s; "
            f"2 gate processes behind Envoy.\n\n```\n{d.out.text()}\n```\n")
    (results / f"drill_redis_{d.name}.md").write_text(text)
    doc = {"drill": d.name, "passed": d.out.passed, "checks": d.out.checks, "facts": d.out.facts,
           "event_t": d.event_t, "fault_t": d.out.fault_t, "limited": d.limited,
           "chat": [{k: r.get(k) for k in ("t", "status", "cache", "latency_ms")} for r in d.out.rows]}
    (results / f"drill_redis_{d.name}.json").write_text(json.dumps(doc))


def drill(name: str, sizes: Sizes, results: Path) -> Outcome:
    d = Drill(name, sizes)
    try:
        start(d)
        asyncio.run(run(d))
    except Exception as e:  # a drill that breaks is a failed drill, with the reason
        d.out.checks.append((f"the drill ran ({type(e).__name__}: {e})", False))
    finally:
        if d.stack is not None:
            d.stack.close()
        if d.topology is not None:
            d.topology.close()
    write(d, results)
    return d.out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.drill_redis", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="+", choices=KINDS)
    p.add_argument("--seconds", type=float, default=30.0, help="steady load (the outage adds its 30 s)")
    p.add_argument("--fault-at", type=float, default=6.0)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--results", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    sizes = Sizes(seconds=a.seconds, fault_at=a.fault_at, concurrency=a.concurrency)
    passed = 0
    for name in a.names:
        out = drill(name, sizes, a.results)
        print(out.text(), flush=True)
        passed += out.passed
    return 0 if passed == len(a.names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
