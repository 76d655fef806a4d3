"""Load generator: the seed's traffic mix through Envoy, every request recorded.

    python -m load.loadgen --stack start --requests 2000 --seconds 60 --rate 40 \\
        --out load/results/runs/NAME
    python -m load.loadgen --stack RUN/stack.json --concurrency 32 ...   (a running stack)

Open loop (`--rate R`: Poisson arrivals, plus a burst of `--burst-size` identical requests
every `--burst-every` s) or closed loop (`--concurrency C`). The run stops at `--requests`
or `--seconds`, whichever comes first, then waits for what is in flight. The output
folder gets `requests.jsonl` (one row per request), `metrics.jsonl` (the gate's Prometheus
counters summed over workers and the simulators' counters, scraped every second) and
`run.json` (options, the simulators' counters before and after); `python -m load.report`
turns them into a report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from .demo import DEMO_CONFIG
from .mix import LIMITED, LOAD_IDENTITY, Draw, Mix
from .stack import Stack

CHAT = "/v1/chat/completions"
# The demo's config (breaker, semantic operating point) with the load generator's callers:
# every standard user has 1/s, burst 5; the generator spreads standard traffic over USERS
# users (x-user-id) except for one key whose own user gets `limited_share` of all requests.
LOAD_CONFIG: dict[str, Any] = {
    **DEMO_CONFIG,
    "identity": LOAD_IDENTITY,
    "ratelimit": {"tiers": {"standard": {"user": LIMITED}}},
}
SCRAPED = ("gate_requests", "gate_cache_requests", "gate_cache_hits", "gate_queue_length",
           "gate_queue_sheds", "gate_breaker_state", "gate_stage_errors", "gate_store_errors",
           "gate_ratelimit_decisions", "gate_stream_errors", "gate_config_reloads",
           "gate_breaker_reroutes", "gate_streams_active")
USERS = 5000
_FAMILY_RE = re.compile(r"Family (\S+) answer:")


@dataclass
class Target:
    """Where a stack listens: Envoy, each gate worker's metrics, each simulator."""

    url: str
    metrics: list[str]
    sims: dict[str, str]

    @classmethod
    def of(cls, stack: Stack) -> Target:
        return cls(stack.url, [f"http://127.0.0.1:{p}/metrics" for p in stack.metrics_ports],
                   {pool: stack.sim_url(pool) for pool in stack.pool_ports})


def load_stack(workers: int = 2, sim_args: list[str] | None = None,
               extra: dict[str, Any] | None = None) -> Stack:
    """The stack the drills and runs use: 2 gate workers, Redis, Envoy, two simulators."""
    config = {**LOAD_CONFIG, **(extra or {})}
    return Stack(gate_config=config, gate_workers=workers, with_redis=True, sim_args=sim_args or [])


@dataclass
class Options:
    requests: int = 1000
    seconds: float = 60.0
    rate: float | None = None
    concurrency: int | None = None
    burst_every: float = 15.0
    burst_size: int = 20
    seed: int = 1
    timeout: float = 60.0
    limited_share: float = 0.02
    scrape_every: float = 1.0


def answer_text(body: bytes, stream: bool) -> tuple[str, bool]:
    """The answer's text and whether it is complete (a stream: `data: [DONE]` arrived)."""
    if not stream or not body.startswith(b"data:"):
        doc = orjson.loads(body)
        choice = doc["choices"][0]
        return str((choice.get("message") or {}).get("content") or choice.get("text") or ""), True
    parts, done = [], False
    for line in body.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            done = True
            continue
        chunk = orjson.loads(line[6:])
        for ch in chunk.get("choices") or []:
            parts.append((ch.get("delta") or {}).get("content") or ch.get("text") or "")
    return "".join(parts), done


async def send(session: aiohttp.ClientSession, url: str, draw: Draw, rid: str, t0: float,
               limit_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"id": rid, "t": round(time.monotonic() - t0, 4), "tier": draw.tier,
                           "family": draw.family, "lang": draw.lang, "size": draw.size,
                           "kind": draw.kind, "stream": draw.stream, "urgent": draw.urgent,
                           "limited": "sk-load-limited" in draw.headers["authorization"]}
    headers = {**draw.headers, "x-request-id": rid, "x-load-id": rid}
    if not row["limited"]:  # standard users are many, each well under its own limit
        headers["x-user-id"] = f"u-{int(hashlib.sha1(rid.encode()).hexdigest()[:8], 16) % USERS}"
    start = time.monotonic()
    try:
        async with session.post(url + CHAT, data=draw.body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=limit_s)) as r:
            row["ttfb_ms"] = round((time.monotonic() - start) * 1000, 2)
            body = await r.read()
            h = r.headers
            row.update(status=r.status, cache=h.get("x-gate-cache", ""),
                       match=h.get("x-gate-cache-match", ""), cluster=h.get("x-gate-cluster", ""),
                       queue_ms=h.get("x-gate-queue-ms", ""), sim=h.get("x-sim-name", ""),
                       request_id=h.get("x-request-id", "") or h.get("x-gate-request-id", ""))
    except (aiohttp.ClientError, TimeoutError) as e:
        row.update(status=0, error=f"{type(e).__name__}: {e}"[:200], complete=False)
        row["latency_ms"] = round((time.monotonic() - start) * 1000, 2)
        return row
    row["latency_ms"] = round((time.monotonic() - start) * 1000, 2)
    if r.status == 200:
        try:
            text, done = answer_text(body, draw.stream)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            text, done = "", False
        row["complete"] = done
        row["answer"] = hashlib.sha1(text.encode()).hexdigest()[:12]
        m = _FAMILY_RE.search(text)
        row["answer_family"] = m.group(1) if m else ""
    else:
        try:
            doc = orjson.loads(body)
            row["error_json"] = isinstance(doc, dict) and isinstance(doc.get("error"), dict)
        except orjson.JSONDecodeError:
            row["error_json"] = False
        row["complete"] = bool(row["error_json"])
        row["error_body"] = body[:160].decode("utf-8", "replace")
    return row


def parse_metrics(texts: list[str]) -> dict[str, float]:
    """Samples of the scraped families, summed over workers (gauges of state: the max)."""
    out: dict[str, float] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if fam.name not in SCRAPED:
                continue
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                key = f"{s.name}{{{labels}}}"
                if fam.name == "gate_breaker_state":
                    out[key] = max(out.get(key, 0.0), s.value)
                else:
                    out[key] = out.get(key, 0.0) + s.value
    return out


async def sim_states(session: aiohttp.ClientSession, target: Target) -> dict[str, dict[str, Any]]:
    out = {}
    for pool, url in target.sims.items():
        try:
            async with session.get(url + "/admin/state", timeout=aiohttp.ClientTimeout(total=2)) as r:
                st = await r.json()
            out[pool] = {k: st[k] for k in ("served", "received", "errors", "cancelled", "running",
                                             "waiting", "hung")}
        except (aiohttp.ClientError, TimeoutError):
            out[pool] = {}
    return out


async def scrape_once(session: aiohttp.ClientSession, target: Target) -> dict[str, Any]:
    texts, up = [], 0
    for url in target.metrics:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                texts.append(await r.text())
                up += 1
        except (aiohttp.ClientError, TimeoutError):
            pass
    return {"gate": parse_metrics(texts), "workers_up": up, "sims": await sim_states(session, target)}


async def scraper(session: aiohttp.ClientSession, target: Target, t0: float, every: float,
                  out: Path, stop: asyncio.Event) -> None:
    with out.open("w") as f:
        while True:
            t = round(time.monotonic() - t0, 3)
            row = await scrape_once(session, target)
            f.write(json.dumps({"t": t, **row}) + "\n")
            f.flush()
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)


@dataclass
class Run:
    rows: list[dict[str, Any]] = field(default_factory=list)
    sims_before: dict[str, dict[str, Any]] = field(default_factory=dict)
    sims_after: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0


async def run_load(target: Target, opts: Options, out: Path | None = None, mix: Mix | None = None,
                   on_row: Callable[[dict[str, Any]], None] | None = None,
                   stop: asyncio.Event | None = None) -> Run:
    """Send the mix until a bound is reached (or `stop` is set); record every request."""
    mix = mix or Mix(limited_share=opts.limited_share)
    rng = random.Random(opts.seed)
    stop = stop or asyncio.Event()
    run = Run()
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    t0 = time.monotonic()
    sink = (out / "requests.jsonl").open("w") if out else None
    async with aiohttp.ClientSession(connector=conn) as session:
        run.sims_before = await sim_states(session, target)
        scrape_stop = asyncio.Event()
        scrape = (asyncio.create_task(scraper(session, target, t0, opts.scrape_every,
                                              out / "metrics.jsonl", scrape_stop)) if out else None)
        sent = 0

        async def one(draw: Draw) -> None:
            nonlocal sent
            sent += 1
            row = await send(session, target.url, draw, f"load-{opts.seed}-{sent}", t0, opts.timeout)
            run.rows.append(row)
            if sink:
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            if on_row:
                on_row(row)

        def more() -> bool:
            return sent < opts.requests and time.monotonic() - t0 < opts.seconds and not stop.is_set()

        if opts.concurrency:
            async def worker() -> None:
                while more():
                    await one(mix.draw(rng))

            await asyncio.gather(*(worker() for _ in range(opts.concurrency)))
        else:
            await _open_loop(opts, mix, rng, one, more, t0)
        run.seconds = time.monotonic() - t0
        await asyncio.sleep(0.5)  # the simulators' counters settle after the last body
        run.sims_after = await sim_states(session, target)
        scrape_stop.set()
        if scrape:
            await scrape
    if sink:
        sink.close()
    return run


async def _open_loop(opts: Options, mix: Mix, rng: random.Random,
                     one: Callable[[Draw], Coroutine[Any, Any, None]], more: Callable[[], bool],
                     t0: float) -> None:
    rate = opts.rate or 10.0
    tasks: set[asyncio.Task[None]] = set()
    next_burst = t0 + opts.burst_every
    nxt = time.monotonic()
    while more():
        nxt += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        batch = [mix.draw(rng)]
        if opts.burst_size > 0 and time.monotonic() >= next_burst:
            next_burst += opts.burst_every
            draw = batch[0]
            while draw.invalid:
                draw = mix.draw(rng)
            batch = [draw] * opts.burst_size
        for draw in batch:
            if not more():
                break
            task = asyncio.create_task(one(draw))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


def write_run(out: Path, opts: Options, run: Run, target: Target) -> None:
    doc = {"options": asdict(opts), "seconds": round(run.seconds, 3), "requests": len(run.rows),
           "sims_before": run.sims_before, "sims_after": run.sims_after, "target": asdict(target)}
    (out / "run.json").write_text(json.dumps(doc, indent=1))


def dry_run(requests: int, seed: int, limited_share: float) -> dict[str, dict[str, float]]:
    """Shares of the mix over `requests` draws, nothing sent."""
    mix, rng = Mix(limited_share=limited_share), random.Random(seed)
    draws = [mix.draw(rng) for _ in range(requests)]
    valid = [d for d in draws if not d.invalid]
    bodies = Counter(d.body for d in valid)

    def shares(values: list[str]) -> dict[str, float]:
        return {k: round(v / max(1, len(values)), 4) for k, v in sorted(Counter(values).items())}

    return {
        "invalid": shares(["invalid" if d.invalid else "valid" for d in draws]),
        "invalid_kinds": shares([d.kind for d in draws if d.invalid]),
        "size": shares([d.size for d in valid]),
        "tier": shares([d.tier for d in draws]),
        "lang": shares([d.lang for d in valid]),
        "variant": shares([d.kind for d in valid]),
        "stream": shares([str(d.stream) for d in draws]),
        "urgent": shares([str(d.urgent) for d in valid]),
        "repeats": {"distinct_bodies": len(bodies), "families": len({d.family for d in valid}),
                    "repeated_bodies": sum(n for n in bodies.values() if n > 1) / max(1, len(valid))},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", default="start", help="'start' (a stack of its own) or a stack.json")
    p.add_argument("--requests", type=int, default=Options.requests)
    p.add_argument("--seconds", type=float, default=Options.seconds)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--rate", type=float, help="open loop: mean arrivals per second")
    g.add_argument("--concurrency", type=int, help="closed loop: requests in flight")
    p.add_argument("--burst-every", type=float, default=Options.burst_every)
    p.add_argument("--burst-size", type=int, default=Options.burst_size)
    p.add_argument("--seed", type=int, default=Options.seed)
    p.add_argument("--limited-share", type=float, default=Options.limited_share)
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true", help="print the mix's shares; send nothing")
    a = p.parse_args(argv)
    if a.dry_run:
        print(json.dumps(dry_run(a.requests, a.seed, a.limited_share), indent=1, ensure_ascii=False))
        return 0
    if a.out is None:
        p.error("--out is required")
    opts = Options(a.requests, a.seconds, a.rate, a.concurrency, a.burst_every, a.burst_size, a.seed,
                   limited_share=a.limited_share)
    if opts.rate is None and opts.concurrency is None:
        opts.concurrency = 32
    a.out.mkdir(parents=True, exist_ok=True)
    stack: Stack | None = None
    if a.stack == "start":
        stack = load_stack().start()
        target = Target.of(stack)
        (a.out / "stack.json").write_text(json.dumps(asdict(target)))
    else:
        target = Target(**json.loads(Path(a.stack).read_text()))
    try:
        run = asyncio.run(run_load(target, opts, a.out))
    finally:
        if stack:
            stack.close()
    write_run(a.out, opts, run, target)
    ok = sum(1 for r in run.rows if r.get("status") == 200)
    print(f"{len(run.rows)} requests in {run.seconds:.1f} s, {ok} × 200 -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
