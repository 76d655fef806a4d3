"""`python -m load.drills [names...]`: faults under steady load through the real stack.

Each drill starts its own stack on 127.0.0.1 (2 gate workers, Redis, Envoy, two
simulators; the load generator's config), runs steady closed-loop load of valid requests,
injects its fault, stops by itself and prints: requests, non-2xx by status, max latency,
time to recover (from the fault to the end of the last failed request) and PASS/FAIL
against the gate's targets. Sizes are flags; `--short` runs every drill in about a minute.

Drills: redis_kill, redis_slow, worker_kill, pool_hang, pool_5xx, reload_valid,
reload_invalid, scheduler_kill, burst40, burst100, soak, fuzz.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

from . import fuzz, report
from .loadgen import CHAT, Options, Run, Target, load_stack, run_load, scrape_once, write_run
from .mix import Mix
from .stack import Stack

VIP = {"authorization": "Bearer sk-load-vip", "content-type": "application/json"}
# Keeps Redis busy for 300 ms per call: nothing else runs meanwhile.
BUSY_LUA = ("local s = redis.call('TIME') while true do local n = redis.call('TIME') "
            "if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > tonumber(ARGV[1]) then return 1 end end")


@dataclass
class Sizes:
    seconds: float = 20.0  # steady load per drill
    fault_at: float = 4.0
    concurrency: int = 8
    rounds: int = 10
    soak_requests: int = 20_000
    soak_concurrency: int = 32
    fuzz_bodies: int = 100_000
    fuzz_concurrency: int = 16
    out: Path = Path("load/results/runs")


SHORT = {"seconds": 12.0, "fault_at": 3.0, "concurrency": 6, "rounds": 3, "soak_requests": 1500,
         "fuzz_bodies": 3000}


@dataclass
class Outcome:
    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    fault_t: float = 0.0
    facts: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not 200 <= int(r.get("status", 0)) < 300]

    @property
    def passed(self) -> bool:
        return all(ok for _, ok in self.checks)

    def recover_s(self) -> float:
        ends = [r["t"] + r["latency_ms"] / 1000 for r in self.failed]
        return max(0.0, max(ends) - self.fault_t) if ends else 0.0

    def text(self) -> str:
        bad = Counter(str(r.get("status")) for r in self.failed)
        lat = max((r.get("latency_ms", 0.0) for r in self.rows), default=0.0)
        lines = [f"== {self.name}: {'PASS' if self.passed else 'FAIL'}",
                 f"   requests {len(self.rows)}, non-2xx {dict(bad) or 0}, max latency {lat:.0f} ms, "
                 f"time to recover {self.recover_s():.1f} s, "
                 f"over 5 s: {sum(1 for r in self.rows if r.get('latency_ms', 0) > 5000)}"]
        lines += [f"   {f}" for f in self.facts]
        lines += [f"   [{'ok' if ok else 'FAIL'}] {c}" for c, ok in self.checks]
        return "\n".join(lines)


async def gate_metric(stack: Stack, key: str) -> float:
    """One gate metric summed over the workers (scraped again until every worker answers)."""
    target = Target.of(stack)
    async with aiohttp.ClientSession() as s:
        for _ in range(10):
            got = await scrape_once(s, target)
            if got["workers_up"] == len(target.metrics):
                break
            await asyncio.sleep(0.5)
        return float(got["gate"].get(key, 0.0))


async def under_load(stack: Stack, sizes: Sizes, fault: Callable[[float], Awaitable[None]],
                     seconds: float | None = None, limit_s: float = 30.0,
                     until_fault_done: bool = False) -> tuple[list[dict[str, Any]], float]:
    """Steady valid load for `seconds` (or until the fault is over); `fault(t0)` runs
    `fault_at` s in. Returns (rows, fault time from the start)."""
    opts = Options(requests=10**9, seconds=3600 if until_fault_done else seconds or sizes.seconds,
                   concurrency=sizes.concurrency, timeout=limit_s, seed=random.randrange(10**6))
    mix = Mix(invalid_share=0.0, limited_share=0.0)
    t0 = time.monotonic()
    fault_t = sizes.fault_at
    stop = asyncio.Event()

    async def inject() -> None:
        nonlocal fault_t
        await asyncio.sleep(sizes.fault_at)
        fault_t = time.monotonic() - t0
        try:
            await fault(t0)
        finally:
            if until_fault_done:
                await asyncio.sleep(1.0)
                stop.set()

    run, _ = await asyncio.gather(run_load(Target.of(stack), opts, mix=mix, stop=stop), inject())
    return run.rows, fault_t


async def breaker_watch(stack: Stack, t0: float, until: float, pool: str = "primary") -> float | None:
    """Seconds (from t0) when any gate worker first reported the pool's breaker open."""
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - t0 < until:
            for url in Target.of(stack).metrics:
                try:
                    async with s.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if f'gate_breaker_state{{pool="{pool}"}} 2.0' in await r.text():
                            return time.monotonic() - t0
                except (aiohttp.ClientError, TimeoutError):
                    pass
            await asyncio.sleep(0.2)
    return None


def answered(rows: list[dict[str, Any]]) -> tuple[str, bool]:
    """Every request got an HTTP answer (an error status counts): none cut or timed out."""
    lost = sum(1 for r in rows if not r.get("status"))
    return f"every request answered ({lost} cut or timed out)", not lost


async def sim_fault(stack: Stack, pool: str, **faults: Any) -> None:
    async with aiohttp.ClientSession() as s, s.post(stack.sim_url(pool) + "/admin/faults", json=faults) as r:
        r.raise_for_status()


# --- the drills -----------------------------------------------------------------------------


async def redis_kill(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    async def fault(t0: float) -> None:
        await asyncio.to_thread(stack.kill, "redis")
        await asyncio.sleep(3)
        await asyncio.to_thread(stack.start_redis)
        out.facts.append(f"Redis killed at {sizes.fault_at:.0f} s, restarted 3 s later (same port)")

    out.rows, out.fault_t = await under_load(stack, sizes, fault)
    out.checks.append(("0 failed requests", not out.failed))


async def redis_slow(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    async def fault(t0: float) -> None:
        def busy() -> int:
            r, n, end = redis.Redis(port=stack.redis_port), 0, time.monotonic() + 4
            while time.monotonic() < end:
                r.eval(BUSY_LUA, 0, 300_000)
                n += 1
                time.sleep(0.05)
            return n

        n = await asyncio.to_thread(busy)
        out.facts.append(f"Redis kept busy by {n} scripts of 300 ms over 4 s")

    out.rows, out.fault_t = await under_load(stack, sizes, fault)
    window = [r for r in out.rows if out.fault_t <= r["t"] <= out.fault_t + 4 and r.get("status") == 200]
    bypass = sum(1 for r in window if r.get("cache") == "bypass")
    out.facts.append(f"bypass answers while slowed: {bypass}/{len(window)}")
    slow = [r for r in out.rows if r["latency_ms"] > 5000]
    out.checks += [("0 failed requests", not out.failed), (f"0 requests over 5 s ({len(slow)})", not slow)]


async def worker_kill(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    async def fault(t0: float) -> None:
        pid = await asyncio.to_thread(stack.kill_gate_worker, 0)
        start = time.monotonic()
        while time.monotonic() - start < 30:
            pids = await asyncio.to_thread(stack.gate_worker_pids)
            if pids.get(0, pid) != pid:
                out.facts.append(f"worker 0 (pid {pid}) SIGKILLed; back listening after "
                                 f"{time.monotonic() - start:.1f} s")
                return
            await asyncio.sleep(0.1)
        out.facts.append("worker 0 did not come back within 30 s")

    out.rows, out.fault_t = await under_load(stack, sizes, fault)
    share = len(out.failed) / max(1, len(out.rows))
    unjson = [r for r in out.failed if not (r.get("error_json") and r.get("request_id"))]
    for r in unjson:  # what kind of request, and how far it got: where the limit lies
        out.facts.append(f"not a JSON error: a {'stream' if r['stream'] else 'JSON'} request, status "
                         f"{r.get('status')}, headers {'in' if 'ttfb_ms' in r else 'not in'}, "
                         f"{r.get('error') or r.get('error_body', '')[:80]!r}")
    out.checks += [(f"≤ 1% failed ({share:.1%})", share <= 0.01),
                   (f"each failure a JSON error with a request id ({len(unjson)} not)", not unjson)]


async def pool_hang(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    opened: list[float | None] = [None]

    async def fault(t0: float) -> None:
        hang_t = time.monotonic() - t0
        await sim_fault(stack, "primary", hang=True)
        opened[0] = await breaker_watch(stack, t0, hang_t + 10)
        await sim_fault(stack, "primary", hang=False)
        out.facts.append(f"primary hung at {hang_t:.1f} s; breaker open at "
                         f"{'never' if opened[0] is None else f'{opened[0] - hang_t:.1f} s after'}")
        opened[0] = None if opened[0] is None else opened[0] - hang_t

    out.rows, out.fault_t = await under_load(stack, sizes, fault, seconds=sizes.seconds + 10)
    out.checks += [("breaker open within 5 s of the hang's start", opened[0] is not None and opened[0] <= 5),
                   answered(out.rows)]


async def pool_5xx(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    opened: list[float | None] = [None]

    async def fault(t0: float) -> None:
        start = time.monotonic() - t0
        await sim_fault(stack, "primary", error_rate=1.0, error_status=500)
        opened[0] = await breaker_watch(stack, t0, start + 6)
        await sim_fault(stack, "primary", error_rate=0.0)
        opened[0] = None if opened[0] is None else opened[0] - start
        out.facts.append(f"primary answered 500 to everything; breaker open "
                         f"{'never' if opened[0] is None else f'{opened[0]:.1f} s after'}")

    out.rows, out.fault_t = await under_load(stack, sizes, fault)
    fallback = sum(1 for r in out.rows if r.get("cluster") == "fallback" and r.get("status") == 200)
    out.facts.append(f"answers from the fallback pool: {fallback}")
    out.checks += [("breaker open within 5 s of the storm's start", opened[0] is not None and opened[0] <= 5),
                   answered(out.rows)]


async def _reload(stack: Stack, sizes: Sizes, out: Outcome, valid: bool) -> None:
    path = stack.workdir / "gate.yaml"
    good = path.read_text()
    result = "done" if valid else "refused"
    key = f"gate_config_reloads_total{{result={result}}}"
    before = await gate_metric(stack, key)

    async def fault(t0: float) -> None:
        for _ in range(2):
            if not valid:
                path.write_text("breaker: [not: a mapping\n")
            await asyncio.to_thread(stack.reload_gate)
            await asyncio.sleep(2)
            path.write_text(good)

    out.rows, out.fault_t = await under_load(stack, sizes, fault)
    after = await gate_metric(stack, key)
    out.facts.append(f"reloads {result}: {after - before:.0f} (2 SIGHUPs × 2 workers)")
    out.checks += [("0 failed requests", not out.failed), (f"the gate counted each reload {result}",
                                                           after - before >= 2)]


async def reload_valid(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    await _reload(stack, sizes, out, True)


async def reload_invalid(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    await _reload(stack, sizes, out, False)


async def scheduler_kill(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    async def fault(t0: float) -> None:
        await asyncio.to_thread(stack.kill, "scheduler-primary")
        await asyncio.sleep(3)
        await asyncio.to_thread(stack.start_scheduler, "primary")
        out.facts.append("standalone scheduler of the primary pool SIGKILLed, restarted 3 s later")

    out.rows, out.fault_t = await under_load(stack, sizes, fault)
    share = len(out.failed) / max(1, len(out.rows))
    end = max((r["t"] for r in out.rows), default=0.0)
    late = [r for r in out.failed if r["t"] > end - 3]
    out.checks += [(f"≤ 1% failed ({share:.1%})", share <= 0.01),
                   ("no failures in the last 3 s (recovered)", not late)]


async def _bursts(stack: Stack, sizes: Sizes, out: Outcome, n: int) -> None:
    async def fault(t0: float) -> None:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            tag = random.randrange(10**9)
            for rnd in range(sizes.rounds):
                fam = f"burst{n}-{tag}-{rnd}"
                body = orjson.dumps({"model": "llama-3-8b", "max_tokens": 16, "messages": [
                    {"role": "user", "content": f"Summarise refund policy number {tag} {rnd} in one line"}]})

                async def one(i: int, fam: str = fam, body: bytes = body) -> tuple[int, str, float]:
                    start = time.monotonic()
                    async with s.post(stack.url + CHAT, data=body, headers={**VIP, "x-sim-family": fam}) as r:
                        text = await r.text()
                        return r.status, text if r.status != 200 else \
                            orjson.loads(text)["choices"][0]["message"]["content"], time.monotonic() - start

                res = await asyncio.gather(*(one(i) for i in range(n)))
                await asyncio.sleep(0.3)
                calls = 0
                for pool in stack.pool_ports:
                    async with s.get(stack.sim_url(pool) + "/admin/state") as r:
                        calls += int((await r.json())["served_by_family"].get(fam, 0))
                non2xx = Counter(st for st, _, _ in res if st != 200)
                answers = {a for st, a, _ in res if st == 200}
                slowest = max(x for _, _, x in res)
                out.facts.append(f"round {rnd + 1}: model calls {calls}, non-2xx {dict(non2xx) or 0}, "
                                 f"distinct answers {len(answers)}, slowest {slowest:.2f} s")
                failed = next((text for st, text, _ in res if st != 200), None)
                if failed is not None:
                    out.facts.append(f"  first non-2xx body: {failed[:300]}")
                out.checks.append((f"round {rnd + 1}: ≤ 2 calls, 0 non-2xx, 1 answer",
                                   calls <= 2 and not non2xx and len(answers) == 1))
                await asyncio.sleep(0.5)

    steady = Sizes(**{**sizes.__dict__, "concurrency": 2, "fault_at": 1.0})
    out.rows, out.fault_t = await under_load(stack, steady, fault, until_fault_done=True)


async def burst40(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    await _bursts(stack, sizes, out, 40)


async def burst100(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    await _bursts(stack, sizes, out, 100)


async def soak(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    opts = Options(requests=sizes.soak_requests, seconds=7200, concurrency=sizes.soak_concurrency, seed=11)
    run_dir = sizes.out / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    target = Target.of(stack)
    run: Run = await run_load(target, opts, run_dir)
    write_run(run_dir, opts, run, target)
    report.build(run_dir)
    out.rows = run.rows
    served: dict[str, float] = {}
    sim_max = 0.0
    async with aiohttp.ClientSession() as s:
        for pool in stack.pool_ports:
            async with s.get(stack.sim_url(pool) + "/admin/served") as r:
                doc = await r.json()
            served.update(doc["by_id"])
            sim_max = max(sim_max, float(doc["max_ms"]))
    valid = [r for r in run.rows if not r["kind"].startswith("invalid") and r.get("status") == 200]
    bypass = sum(1 for r in valid if r.get("cache") == "bypass") / max(1, len(valid))
    limited = sum(1 for r in run.rows if r.get("limited") and r.get("status") == 200)
    bound = report.limited_bound(run.seconds)
    slow = [r for r in run.rows if r["latency_ms"] > 5000
            and float(served.get(r["id"], sim_max)) < 1000]
    acc = report.accounting(run.rows, run.sims_before, run.sims_after)
    out.facts += [f"{len(run.rows)} requests in {run.seconds:.0f} s; report: {run_dir}/report.md",
                  f"bypass share {bypass:.1%}; limited user admitted {limited} (bound {bound:.0f}); "
                  f"slowest simulator answer {sim_max:.0f} ms", acc.line()]
    out.checks += [(f"bypass share ≤ 1% ({bypass:.1%})", bypass <= 0.01),
                   (f"limited user ≤ 1.1 × (rate × s + burst) ({limited} ≤ {bound:.0f})", limited <= bound),
                   (f"0 requests > 5 s that the simulator served < 1 s ({len(slow)})", not slow),
                   ("exact accounting", acc.holds)]
    # Only valid-but-refused statuses are expected here; the summary's non-2xx covers them all.
    out.rows = [r for r in run.rows if not r["kind"].startswith("invalid") and r.get("status") != 429]


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def fuzz_drill(stack: Stack, sizes: Sizes, out: Outcome) -> None:
    target = Target.of(stack)
    pids = await asyncio.to_thread(stack.gate_worker_pids)
    rss = {i: _rss_kb(p) for i, p in pids.items()}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        before = (await scrape_once(s, target))["gate"]
        rng = random.Random(5)
        statuses: Counter[int] = Counter()
        five: list[str] = []
        sent = 0
        t0 = time.monotonic()

        async def worker() -> None:
            nonlocal sent
            while sent < sizes.fuzz_bodies:
                sent += 1
                body = fuzz.body(rng)
                try:
                    async with s.post(stack.url + CHAT, data=body, headers=VIP,
                                      timeout=aiohttp.ClientTimeout(total=30)) as r:
                        text = await r.read()
                        statuses[r.status] += 1
                        if r.status >= 500 and len(five) < 5:
                            five.append(f"{r.status} {text[:120]!r} <- {body[:100]!r}")
                except (aiohttp.ClientError, TimeoutError) as e:
                    statuses[0] += 1
                    if len(five) < 5:
                        five.append(f"{type(e).__name__} <- {body[:100]!r}")

        await asyncio.gather(*(worker() for _ in range(sizes.fuzz_concurrency)))
        seconds = time.monotonic() - t0
        named = []
        for field_name, doc in fuzz.MALFORMED:
            headers = {"authorization": VIP["authorization"]}
            async with s.post(stack.url + CHAT, json=doc, headers=headers) as r:
                text = await r.text()
                named.append(r.status == 400 and field_name in text)
        after = (await scrape_once(s, target))["gate"]
    stage = {k: after[k] - before.get(k, 0.0) for k in after
             if k.startswith("gate_stage_errors_total") and after[k] - before.get(k, 0.0) > 0}
    pids_after = await asyncio.to_thread(stack.gate_worker_pids)
    restarts = sum(1 for i, p in pids.items() if pids_after.get(i) != p)
    growth = {i: (_rss_kb(p) - rss.get(i, 0)) // 1024 for i, p in pids_after.items() if p == pids.get(i)}
    n5 = sum(v for k, v in statuses.items() if k >= 500 or k == 0)
    out.facts += [f"{sent} bodies in {seconds:.0f} s; statuses {dict(sorted(statuses.items()))}",
                  f"stage errors {stage or 0}; worker RSS growth MB {growth}", *five]
    out.checks += [(f"0 stage errors ({sum(stage.values()):.0f})", not stage),
                   (f"0 5xx or broken connections ({n5})", n5 == 0),
                   (f"0 worker restarts ({restarts})", restarts == 0),
                   (f"a malformed role or part type gets 400 naming the field ({sum(named)}/{len(named)})",
                    all(named))]


DRILLS: dict[str, Callable[[Stack, Sizes, Outcome], Coroutine[Any, Any, None]]] = {
    "redis_kill": redis_kill, "redis_slow": redis_slow, "worker_kill": worker_kill,
    "pool_hang": pool_hang, "pool_5xx": pool_5xx, "reload_valid": reload_valid,
    "reload_invalid": reload_invalid, "scheduler_kill": scheduler_kill, "burst40": burst40,
    "burst100": burst100, "soak": soak, "fuzz": fuzz_drill,
}


def run_drill(name: str, sizes: Sizes) -> Outcome:
    stack = load_stack()
    if name == "scheduler_kill":
        stack.scheduler_pools = ["primary"]
    out = Outcome(name)
    with stack:
        try:
            asyncio.run(DRILLS[name](stack, sizes, out))
        except Exception as e:  # a drill that breaks is a failed drill, with the reason
            out.checks.append((f"the drill ran ({type(e).__name__}: {e})", False))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.drills", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help=f"drills to run (default: all): {', '.join(DRILLS)}")
    p.add_argument("--short", action="store_true", help="sizes that run each drill in about a minute")
    d = Sizes()
    for f in ("seconds", "fault_at", "concurrency", "rounds", "soak_requests", "soak_concurrency",
              "fuzz_bodies", "fuzz_concurrency"):
        p.add_argument("--" + f.replace("_", "-"), type=type(getattr(d, f)), default=None)
    p.add_argument("--out", type=Path, default=d.out, help="folder for the soak's run and report")
    p.add_argument("--summary", type=Path, help="also write the printed results to this file")
    a = p.parse_args(argv)
    unknown = [n for n in a.names if n not in DRILLS]
    if unknown:
        p.error(f"unknown drills {unknown}; known: {', '.join(DRILLS)}")
    values = {**(SHORT if a.short else {}),
              **{k: v for k, v in vars(a).items() if k in Sizes.__dataclass_fields__ and v is not None}}
    sizes = Sizes(**values)
    texts, passed = [], 0
    for name in a.names or list(DRILLS):
        out = run_drill(name, sizes)
        texts.append(out.text())
        print(texts[-1], flush=True)
        passed += out.passed
    total = len(a.names or DRILLS)
    print(f"\n{passed}/{total} drills passed")
    if a.summary:
        a.summary.write_text("\n\n".join(texts) + f"\n\n{passed}/{total} drills passed\n")
    return 0 if passed == total else 1


if __name__ == "__main__":
    raise SystemExit(main())

