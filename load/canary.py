"""A model with two versions behind real Envoy: two simulators as the versions' pools.

    python -m load.canary share [--requests 10000 --callers 1000 --weight 15 --workers 2]
    python -m load.canary rollout [--fault none|slow|errors --hold 5 --rate 40]

`share` starts the stack (Envoy, gate workers, a simulator per version), sends the requests
from the callers (each caller an `x-user-id`), and prints the canary's measured share and
how many callers saw more than one version. `rollout` runs a progressive rollout of the
canary (5 → 25 → 50 → 100%) under steady load, with Redis shared by the gate workers;
with a fault the canary turns 3x slower (`slow`) or fails 20% with 5xx (`errors`) once it
reaches 25%. It prints the rollout's steps as they happened and what the users of each
version saw. Tests and docs/versions.md use its helpers.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from load.stack import Stack

CHAT = "/v1/chat/completions"
MODEL = "chat"
POOL = {"v1": "primary", "v2": "canary"}  # each version's pool (and simulator name)


def versions_config(weight: float = 0.0, rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    """Gate config: model `chat` as v1 (pool `primary`, stable) and v2 (pool `canary`)."""
    chat: dict[str, Any] = {
        "versions": [
            {"name": "v1", "pool": "primary", "weight": 100 - weight},
            {"name": "v2", "pool": "canary", "weight": weight, "canary": True},
        ]
    }
    if rollout is not None:
        chat["rollout"] = rollout
    return {
        "routing": {
            "pools": {"primary": {"cluster": "primary"}, "canary": {"cluster": "canary"}},
            "models": {},
            "default_pool": None,
            "versions": {MODEL: chat},
        },
        "identity": {
            "api_keys": {"sk-tester": {"tenant": "qa", "canary": True}, "sk-user": {"tenant": "acme"}}
        },
        "cache": {"enabled": False},  # every request reaches a version
        "breaker": {"enabled": False},  # the versions are judged by the rollout alone
    }


def versions_stack(config: dict[str, Any], workers: int = 2, **kwargs: Any) -> Stack:
    pools = {"primary": [MODEL], "canary": [MODEL]}
    return Stack(gate_workers=workers, gate_config=config, pool_models=pools, **kwargs)


@dataclass(frozen=True)
class Answer:
    user: str
    status: int
    version: str | None  # x-gate-version
    served_by: str | None  # x-sim-name: the pool that really answered
    at: float
    latency_s: float


async def ask(client: httpx.AsyncClient, user: str, headers: dict[str, str] | None = None) -> Answer:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello from {user}"}], "max_tokens": 4}
    started = time.monotonic()
    try:
        r = await client.post(CHAT, json=body, headers={"x-user-id": user, **(headers or {})})
    except httpx.HTTPError:
        return Answer(user, 0, None, None, started, time.monotonic() - started)
    return Answer(
        user, r.status_code, r.headers.get("x-gate-version"), r.headers.get("x-sim-name"), started,
        time.monotonic() - started,
    )


async def drive(
    url: str, callers: int, requests: int, concurrency: int = 32, headers: dict[str, str] | None = None,
    user_prefix: str = "user-",
) -> list[Answer]:
    """`requests` requests, caller i % callers each, `concurrency` at a time."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    answers: list[Answer] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                answers.append(await ask(client, f"{user_prefix}{i % callers}", headers))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


async def steady(
    url: str, stop: asyncio.Event, rate: float, callers: int = 200, headers: dict[str, str] | None = None
) -> list[Answer]:
    """Requests at `rate` per second until `stop` is set (open loop: a slow answer adds no gap)."""
    answers: list[Answer] = []
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

        async def one(user: str) -> None:
            answers.append(await ask(client, user, headers))

        i = 0
        started = time.monotonic()
        while not stop.is_set():
            task = asyncio.get_running_loop().create_task(one(f"user-{i % callers}"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)
    return answers


def summarize(answers: list[Answer], canary: str = "v2") -> dict[str, Any]:
    ok = [a for a in answers if a.status == 200]
    by_user: dict[str, set[str | None]] = {}
    for a in ok:
        by_user.setdefault(a.user, set()).add(a.version)
    versions = Counter(a.version for a in ok)
    return {
        "requests": len(answers),
        "failed": len(answers) - len(ok),
        "callers": len(by_user),
        "canary_share": versions[canary] / len(ok) if ok else 0.0,
        "callers_on_two_versions": sum(len(v) > 1 for v in by_user.values()),
        "served_elsewhere": sum(a.served_by != POOL.get(a.version or "") for a in ok),
    }


FAULTS = {
    "slow": ("/admin/config", {"base_ttft_ms": 60, "itl_ms": 60}),  # 3x the --itl-ms 20 defaults
    "errors": ("/admin/faults", {"error_rate": 0.2, "error_status": 500}),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if ordered else float("nan")


def seen_by_users(answers: list[Answer]) -> list[str]:
    lines = [f"{'version':<9}{'requests':>9}{'callers':>9}{'errors':>8}{'p50 ms':>8}{'p95 ms':>8}"]
    for version in sorted({a.version or "-" for a in answers}):
        mine = [a for a in answers if (a.version or "-") == version]
        ok = [a.latency_s * 1000 for a in mine if a.status == 200]
        lines.append(f"{version:<9}{len(mine):>9}{len({a.user for a in mine}):>9}"
                     f"{len(mine) - len(ok):>8}{percentile(ok, 0.5):>8.0f}{percentile(ok, 0.95):>8.0f}")
    moves: Counter[str] = Counter()
    last: dict[str, str | None] = {}
    for a in sorted(answers, key=lambda a: a.at):
        if a.status == 200:
            if last.get(a.user, a.version) != a.version:
                moves[f"{last[a.user]} -> {a.version}"] += 1
            last[a.user] = a.version
    lines.append("callers moved: " + (", ".join(f"{k}: {v}" for k, v in sorted(moves.items())) or "none"))
    return lines


async def run_rollout(stack: Stack, fault: str, rate: float) -> tuple[list[Answer], list[str]]:
    import redis.asyncio as aioredis

    from extproc.versions import shared

    client = aioredis.Redis(port=stack.redis_port)
    stop = asyncio.Event()
    load = asyncio.get_running_loop().create_task(steady(stack.url, stop, rate))
    started, last, timeline, faulted = time.monotonic(), None, [], False
    ended_at: float | None = None
    async with httpx.AsyncClient() as http:
        while time.monotonic() - started < 120:
            state = shared.decode(await client.get(shared.state_key("gate:versions:", MODEL)))
            now = time.monotonic() - started
            if state is not None and state != last:
                last = state
                timeline.append(f"+{now:5.1f}s  canary {state.weight:>5g}%  {state.phase:<12} {state.reason}")
                if fault != "none" and not faulted and state.weight >= 25:
                    path, knobs = FAULTS[fault]
                    await http.post(stack.sim_url("canary") + path, json=knobs)
                    faulted = True
                    timeline.append(f"+{time.monotonic() - started:5.1f}s  fault: canary {fault}")
                if state.phase in ("done", "rolled_back") and ended_at is None:
                    ended_at = now
            if ended_at is not None and now > ended_at + 3:
                break
            await asyncio.sleep(0.05)
    stop.set()
    answers = await load
    await client.aclose()
    return answers, timeline


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.canary", description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=["share", "rollout"])
    p.add_argument("--fault", choices=["none", *FAULTS], default="none")
    p.add_argument("--hold", type=float, default=5.0, help="rollout: seconds each step is held")
    p.add_argument("--rate", type=float, default=40.0, help="rollout: requests per second")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--callers", type=int, default=1000)
    p.add_argument("--weight", type=float, default=15.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args(argv)
    if args.scenario == "rollout":
        plan = {"steps": [5, 25, 50, 100], "hold_s": args.hold, "min_samples": 10, "window_s": 10,
                "max_p95_ratio": 1.5, "p95_slack_s": 0.03}
        config = versions_config(0, plan)
        with versions_stack(config, args.workers, with_redis=True, sim_args=["--itl-ms", "20"]) as stack:
            answers, timeline = asyncio.run(run_rollout(stack, args.fault, args.rate))
        print(f"rollout 5 -> 25 -> 50 -> 100%, each step held {args.hold:g}s, fault: {args.fault}")
        print("\n".join(timeline))
        print(f"\nwhat the users of each version saw ({len(answers)} requests from 200 callers):")
        print("\n".join(seen_by_users(answers)))
        return 0
    with versions_stack(versions_config(args.weight), args.workers) as stack:
        started = time.monotonic()
        answers = asyncio.run(drive(stack.url, args.callers, args.requests, args.concurrency))
        took = time.monotonic() - started
    s = summarize(answers)
    print(f"{s['requests']} requests from {s['callers']} callers in {took:.1f}s, {s['failed']} failed")
    print(f"canary weight {args.weight:g}%: measured share {s['canary_share']:.2%}")
    print(f"callers that saw two versions: {s['callers_on_two_versions']}; "
          f"answers from another pool than the version said: {s['served_elsewhere']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
