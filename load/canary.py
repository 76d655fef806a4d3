"""A model with two versions behind real Envoy: two simulators as the versions' pools.

    python -m load.canary share [--requests 10000 --callers 1000 --weight 15 --workers 2]

starts the stack (Envoy, gate workers, a simulator per version), sends the requests from
the callers (each caller an `x-user-id`), and prints the canary's measured share and how
many callers saw more than one version. Tests and docs/versions.md use its helpers.
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.canary", description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=["share"])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--callers", type=int, default=1000)
    p.add_argument("--weight", type=float, default=15.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args(argv)
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
