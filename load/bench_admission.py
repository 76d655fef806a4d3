"""Admission under overload, through real Envoy: a mixed vip/premium/standard load at about
twice what a simulated pool can run, with the gate's priority queue and without it.

Run: ``python -m load.bench_admission [--seconds 20] [--factor 2.0]``; writes
``load/results/admission.md``. The end-to-end test runs a short version of the same load.

Also measured in the same run: VIP p99 at overload against its unloaded p99 (the ratio to
quote), the same load with the vip reserve off (what the reserve costs the other tiers), and
a burst of 80 vip + 20 standard requests on a pool slowed by 3 s (how long a shed takes).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from load.stack import LOOPBACK, Stack, free_port, wait_port

CHAT = "/v1/chat/completions"
KEYS = {"vip": "sk-vip", "premium": "sk-premium", "standard": "sk-standard"}
MIX = {"vip": 0.15, "premium": 0.25, "standard": 0.6}
RESULTS = Path(__file__).resolve().parent / "results"

# The simulated pool: 4 sequences at once, ~20 tokens at 10 ms each: about 0.25 s a request.
SIM_ARGS = ["--max-num-seqs", "4", "--itl-ms", "10", "--base-ttft-ms", "20"]
MAX_TOKENS = 20


def gate_config(pool_port: int, pool: dict[str, Any] | None = None, **admission: Any) -> dict[str, Any]:
    """Keys per tier, and the primary pool's capacity read from its simulator's /metrics."""
    capacity = {
        "source": "vllm",
        "metrics_urls": [f"http://{LOOPBACK}:{pool_port}/metrics"],
        "refresh_ms": 100,
    }
    section: dict[str, Any] = {"pools": {"primary": {"capacity": capacity, **(pool or {})}}}
    for key, value in admission.items():
        section[key] = value
    return {
        "identity": {"api_keys": {key: {"tenant": f"t-{tier}", "tier": tier} for tier, key in KEYS.items()}},
        "admission": section,
    }


def stack_for(pool_port: int, sim_args: list[str] = SIM_ARGS, pool: dict[str, Any] | None = None,
              **admission: Any) -> Stack:
    ports = {"primary": pool_port, "fallback": free_port()}
    return Stack(gate_config=gate_config(pool_port, pool, **admission), sim_args=sim_args, pool_ports=ports)


@dataclass
class Result:
    cls: str
    status: int
    latency: float
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    load_id: str = ""


def request_body(rng: random.Random, i: int, prefix: str = "") -> dict[str, Any]:
    words = 8 if rng.random() < 0.7 else 300  # short and long prompts
    text = f"{prefix}request {i}: " + " ".join(
        rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(words)
    )
    return {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
    }


async def one(client: httpx.AsyncClient, cls: str, body: dict[str, Any]) -> Result:
    load_id = uuid.uuid4().hex
    headers = {"authorization": f"Bearer {KEYS[cls]}", "x-load-id": load_id}
    started = time.perf_counter()
    try:
        r = await client.post(CHAT, json=body, headers=headers)
    except httpx.HTTPError as exc:
        return Result(cls, 0, time.perf_counter() - started, body={"exception": repr(exc)}, load_id=load_id)
    latency = time.perf_counter() - started
    parsed = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    return Result(cls, r.status_code, latency, dict(r.headers), parsed, load_id)


@dataclass
class Alone:
    p99: float
    line: str


def vip_alone(results: list[Result]) -> Alone:
    """VIP's own requests of the load, without the rest: the p99 that VIP's arrivals alone
    give on this pool (they queue behind each other when more come at once than it has
    slots), which no scheduling of the other tiers can take away."""
    ok = [r.latency for r in results if r.status == 200]
    p99 = quantile(ok, 0.99)
    return Alone(p99, f"VIP alone, its requests of the same load at the same times: {len(results)} sent, "
                      f"{len(ok)} answered, p50 {quantile(ok, 0.5):.3f} s, p99 {p99:.3f} s.")


def vip_split(stack: Stack, results: list[Result]) -> str:
    """Where VIP's answered requests spent their time: the gate's queue, the model server
    (receipt to last token, its own queue included), and the rest (client, Envoy, the gate)."""
    with urllib.request.urlopen(stack.sim_url("primary") + "/admin/served", timeout=5) as r:
        served: dict[str, float] = orjson.loads(r.read())["by_id"]
    vip = [r for r in results if r.cls == "vip" and r.status == 200 and r.load_id in served]
    queue = [float(r.headers.get("x-gate-queue-ms", 0)) / 1000 for r in vip]
    server = [served[r.load_id] / 1000 for r in vip]
    rest = [r.latency - q - m for r, q, m in zip(vip, queue, server, strict=True)]
    parts = {"gate queue": queue, "model server": server, "the rest (client, Envoy, gate)": rest}
    return "VIP time by part, p50 / p99: " + "; ".join(
        f"{name} {quantile(v, 0.5):.3f} / {quantile(v, 0.99):.3f} s" for name, v in parts.items()
    ) + "."


async def mixed_load(
    url: str, rate: float, seconds: float, seed: int = 1, mix: dict[str, float] = MIX, only: str | None = None
) -> list[Result]:
    """Open loop: Poisson arrivals at `rate`/s for `seconds`, classes drawn from `mix`. With
    `only`, just that class's requests of the same load, at the same times and of the same
    sizes (other questions: no cache hits on the stack that runs the whole load after)."""
    rng = random.Random(seed)
    classes, weights = list(mix), list(mix.values())
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tasks: list[asyncio.Task[Result]] = []
        start = time.perf_counter()
        at = 0.0
        i = 0
        while at < seconds:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            cls = rng.choices(classes, weights)[0]
            body = request_body(rng, i, prefix="alone: " if only else "")
            if only is None or cls == only:
                tasks.append(asyncio.create_task(one(client, cls, body)))
            i += 1
            at += rng.expovariate(rate)
        return list(await asyncio.gather(*tasks))


async def sequential(url: str, cls: str, count: int) -> list[Result]:
    rng = random.Random(7)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return [await one(client, cls, request_body(rng, i)) for i in range(count)]


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def by_class(results: list[Result]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for cls in KEYS:
        mine = [r for r in results if r.cls == cls]
        ok = [r.latency for r in mine if r.status == 200]
        waits = [float(r.headers.get("x-gate-queue-ms", 0)) for r in mine if r.status == 200]
        out[cls] = {
            "sent": len(mine),
            "ok": len(ok),
            "shed": sum(r.status == 503 for r in mine),
            "other": sum(r.status not in (200, 503) for r in mine),
            "p50": quantile(ok, 0.5),
            "p99": quantile(ok, 0.99),
            "queue_p50_ms": quantile(waits, 0.5),
            "queue_p99_ms": quantile(waits, 0.99),
        }
    return out


def scrape(port: int, name: str, *labels: str) -> float:
    """Sum of the samples of one metric that carry every one of `labels` (0 when absent)."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=2) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " ")) and all(label in line for label in labels)
    )


def sim_state(stack: Stack) -> dict[str, Any]:
    with urllib.request.urlopen(stack.sim_url("primary") + "/admin/state", timeout=2) as r:
        state: dict[str, Any] = orjson.loads(r.read())
    return state


async def sample_idle(stack: Stack, seconds: float) -> tuple[int, int]:
    """(samples with work queued at the gate, of those how many found the pool running < its max)."""
    queued = idle = 0
    async with httpx.AsyncClient(timeout=2) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            waiting = await asyncio.to_thread(scrape, stack.metrics_ports[0], "gate_queue_length")
            state = (await client.get(stack.sim_url("primary") + "/admin/state")).json()
            if waiting > 0:
                queued += 1
                idle += state["running"] < 4
            await asyncio.sleep(0.05)
    return queued, idle


def start_scheduler(stack: Stack, config_path: Path, port: int, metrics_port: int) -> None:
    args = [
        sys.executable,
        "-m",
        "extproc.cli",
        "scheduler",
        "--pool",
        "primary",
        "--port",
        str(port),
        "--config",
        str(config_path),
        "--metrics-port",
        str(metrics_port),
    ]
    wait_port(port, 30, stack._spawn("scheduler", args))


def table(title: str, stats: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| class | sent | 200 | 503 | other | p50 s | p99 s | queue p50 ms | queue p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cls, s in stats.items():
        lines.append(
            f"| {cls} | {s['sent']:.0f} | {s['ok']:.0f} | {s['shed']:.0f} | {s['other']:.0f} | "
            f"{s['p50']:.3f} | {s['p99']:.3f} | {s['queue_p50_ms']:.0f} | {s['queue_p99_ms']:.0f} |"
        )
    return [*lines, ""]


def throughput(results: list[Result], seconds: float) -> dict[str, float]:
    return {cls: sum(r.cls == cls and r.status == 200 for r in results) / seconds for cls in KEYS}


async def burst_sheds(
    stack: Stack,
    vip: int = 80,
    standard: int = 20,
    slow_ms: float = 3000,
    client_timeout_s: float | None = None,
) -> list[str]:
    """A pool slowed by `slow_ms`, then `vip` + `standard` concurrent requests: when do the sheds
    come? With `client_timeout_s`, the clients say their timeout as OpenAI's SDKs do and give
    up after it: do they get 503s or time-outs?"""
    admin = stack.sim_url("primary") + "/admin/faults"
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(admin, json={"extra_latency_ms": slow_ms})
    try:
        rng = random.Random(3)
        said = {"x-stainless-read-timeout": f"{client_timeout_s:g}"} if client_timeout_s else {}
        timeout = client_timeout_s or 60
        async with httpx.AsyncClient(base_url=stack.url, timeout=timeout, headers=said) as client:
            # The slowdown shows in the service times of a first wave, as it would in production
            # (vip, so that the slot kept free for vip does not queue one of them).
            n = 10_000 if client_timeout_s else 0  # other questions than an earlier burst's: no cache hits
            await asyncio.gather(*(one(client, "vip", request_body(rng, n + i)) for i in range(4)))
            started = time.perf_counter()
            tasks = [one(client, "vip", request_body(rng, n + 4 + i)) for i in range(vip)]
            tasks += [one(client, "standard", request_body(rng, n + 4 + vip + i)) for i in range(standard)]
            results = await asyncio.gather(*tasks)
            total = time.perf_counter() - started
    finally:
        async with httpx.AsyncClient(timeout=5) as client:
            await client.post(admin, json={"extra_latency_ms": 0})
    sheds = [r.latency for r in results if r.status == 503]
    ok = [r.latency for r in results if r.status == 200]
    late = sum(t > 1.0 for t in sheds)
    timeouts = sum(r.status == 0 and "Timeout" in r.body.get("exception", "") for r in results)
    who = f", clients with a {client_timeout_s:g} s timeout" if client_timeout_s else ""
    return [
        f"### Burst on a slowed pool ({vip} vip + {standard} standard at once, "
        f"primary {slow_ms / 1000:g} s slower{who})",
        "",
        f"{len(ok)} answered (p50 {quantile(ok, 0.5):.2f} s), {len(sheds)} shed: time to the 503 "
        f"p50 {quantile(sheds, 0.5):.3f} s, p99 {quantile(sheds, 0.99):.3f} s, "
        f"max {max(sheds, default=0):.3f} s; "
        f"{late} sheds took over 1 s; client time-outs {timeouts}; "
        f"other outcomes {sum(r.status not in (200, 503) for r in results) - timeouts}; "
        f"the burst took {total:.1f} s.",
        "",
    ]


async def bench(
    seconds: float,
    factor: float,
    reserve_off: bool = True,
    burst: bool = True,
    reserve_share: float | None = None,
    preempt_slots: int = 4,
    unloaded_n: int = 100,
    fifo: bool = True,
) -> str:
    capacity_rps = 4 / 0.25
    rate = capacity_rps * factor
    out = [
        "# Admission under overload",
        "",
        f"Simulated pool: `{' '.join(SIM_ARGS)}`, max_tokens {MAX_TOKENS} (about {capacity_rps:.0f} req/s). "
        f"Load: Poisson {rate:.0f} req/s ({factor:g}x) for {seconds:g} s, "
        + ", ".join(f"{c} {w:.0%}" for c, w in MIX.items())
        + "; 70 % short prompts, 30 % of 300 words.",
        f"Command: `python -m load.bench_admission --seconds {seconds:g} --factor {factor:g}"
        + (f" --reserve-share {reserve_share:g}" if reserve_share is not None else "")
        + (f" --preempt-slots {preempt_slots}" if preempt_slots != 4 else "")
        + (f" --unloaded {unloaded_n}" if unloaded_n != 100 else "")
        + "`",
        "",
    ]
    deadlines = {"vip": 10000, "premium": 8000, "standard": 5000}
    with stack_for(free_port(), deadline_ms=deadlines) as stack:
        unloaded = await sequential(stack.url, "vip", unloaded_n)
        base = [r.latency for r in unloaded if r.status == 200]
        out += [
            f"Unloaded VIP latency: p50 {quantile(base, 0.5):.3f} s, p99 {quantile(base, 0.99):.3f} s",
            "",
            vip_split(stack, unloaded),
            "",
        ]
        alone = vip_alone(await mixed_load(stack.url, rate, seconds, only="vip"))
        out += [alone.line, ""]
        load = asyncio.create_task(mixed_load(stack.url, rate, seconds))
        await asyncio.sleep(2)
        queued, idle = await sample_idle(stack, seconds - 3)
        results = await load
        stats = by_class(results)
        out += table("With the gate's admission queue (vip reserve on, the default)", stats)
        out += [
            f"VIP p99 at {factor:g}x overload vs unloaded: {stats['vip']['p99'] / quantile(base, 0.99):.2f}x "
            f"(p50 {stats['vip']['p50'] / quantile(base, 0.5):.2f}x); vs VIP alone at the same times: "
            f"{stats['vip']['p99'] / alone.p99:.2f}x.",
            "",
            vip_split(stack, results),
            "",
        ]
        eta = [r.body["error"]["eta_ms"] for r in results if r.status == 503]
        shed_s = [r.latency for r in results if r.status == 503]
        out += [
            f"Sheds: {len(eta)}, all 503 with retry-after and an ETA (median {quantile(eta, 0.5):.0f} ms), "
            f"answered in p50 {quantile(shed_s, 0.5):.3f} s / p99 {quantile(shed_s, 0.99):.3f} s. "
            f"The pool was sampled {queued} times while work was queued at the gate; it ran below its "
            f"4 slots in {idle} of them (the samples race the release round trip).",
            "",
        ]
        if burst:
            out += await burst_sheds(stack)
            out += await burst_sheds(stack, client_timeout_s=5.0)
    variants: list[tuple[str, dict[str, Any]]] = []
    if preempt_slots:
        priority = {"sim_args": [*SIM_ARGS, "--scheduling-policy", "priority"],
                    "pool": {"preempt_slots": preempt_slots}}
        variants.append((f"vLLM scheduling by priority, vip {preempt_slots} slots over the limit "
                         f"(preempt_slots: {preempt_slots})", priority))
    if reserve_off:
        variants.append(("vip reserve off (reserve_factor: 0)", {"reserve_factor": 0}))
    if reserve_share is not None:
        shared = {"reserve_factor": 3.0, "reserve_max_share": reserve_share}
        variants.append((f"vip reserve up to {reserve_share:g} of the pool (reserve_factor: 3)", shared))
    for title, settings in variants:
        with stack_for(free_port(), deadline_ms=deadlines, **settings) as stack:
            await sequential(stack.url, "vip", 5)
            alone_here = vip_alone(await mixed_load(stack.url, rate, seconds, only="vip"))
            other = await mixed_load(stack.url, rate, seconds)
            preempted = sim_state(stack)["preemptions"]
            split = vip_split(stack, other)
        stats_other = by_class(other)
        out += table(f"Same load, {title}", stats_other)
        out += [split, "", alone_here.line, ""]
        if preempted:
            out += [f"The model server preempted a running request {preempted} times.", ""]
        on_rate, other_rate = throughput(results, seconds), throughput(other, seconds)
        out += [
            f"Answered per second, default / {title}: "
            + ", ".join(f"{c} {on_rate[c]:.1f} / {other_rate[c]:.1f}" for c in KEYS)
            + f"; VIP p99 {stats['vip']['p99']:.3f} s / {stats_other['vip']['p99']:.3f} s "
            f"({stats_other['vip']['p99'] / quantile(base, 0.99):.2f}x unloaded, "
            f"{stats_other['vip']['p99'] / alone_here.p99:.2f}x VIP alone at the same times).",
            "",
        ]
    if not fifo:
        return "\n".join(out)
    with stack_for(free_port(), enabled=False) as stack:
        results = await mixed_load(stack.url, rate, seconds)
        out += table("Without admission (every request goes straight to the pool's FIFO)", by_class(results))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.bench_admission", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--no-reserve-off", action="store_true", help="skip the run with the vip reserve off")
    parser.add_argument("--no-burst", action="store_true", help="skip the burst on a slowed pool")
    parser.add_argument("--reserve-share", type=float, help="also run with a vip reserve of up to this share")
    parser.add_argument("--preempt-slots", type=int, default=4,
                        help="vip slots over the limit, priority-scheduling pool run (0: skip it)")
    parser.add_argument("--unloaded", type=int, default=100,
                        help="sequential vip requests on the idle pool: the p99 the overload is compared to")
    parser.add_argument("--no-fifo", action="store_true", help="skip the run without admission")
    parser.add_argument("--out", type=Path, default=RESULTS / "admission.md")
    args = parser.parse_args(argv)
    run = bench(args.seconds, args.factor, not args.no_reserve_off, not args.no_burst, args.reserve_share,
                args.preempt_slots, args.unloaded, not args.no_fifo)
    text = asyncio.run(run)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
