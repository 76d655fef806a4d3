"""`llm-gate breaker`: show every pool's breaker as the gates share it, or set one by hand.

    llm-gate breaker status --redis redis://host:6379/0 [--config gate.yaml] [--json]
    llm-gate breaker force primary open --redis ... [--config gate.yaml]

`force` writes a new state version; every gate process adopts it within
`sync_interval_s` and the state machine goes on from there (a forced OPEN probes after
`hold_s`, a forced CLOSED re-opens if the pool is still slow).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from ..config import Config, load_config_or_report
from ..redis_client import Client
from ..redis_conn import admin_client
from . import shared
from .state import BreakerState, Phase
from .window import Window, summarize


async def status(client: Client, config: Config, now: float) -> list[dict[str, Any]]:
    b = config.breaker
    rows = []
    for pool in config.routing.pools:
        stored = await shared.read_state(client, b.key_prefix, pool)
        # No state yet: the whole window counts, as in the gate (its state starts at 0).
        state = stored or BreakerState(Phase.CLOSED, 0.0, 0, "no state yet")
        window = Window(b.window_s, b.slices)
        slices = await shared.read_slices(client, b.key_prefix, pool, window.span(now, state.since))
        stats = summarize(slices, window.covered_s(now, state.since))
        rows.append(
            {
                "pool": pool,
                "state": state.phase.value,
                "for_s": round(now - state.since, 1) if stored is not None else None,
                "version": state.version,
                "reason": state.reason,
                "p95_s": stats.p95_s,
                "error_rate": round(stats.error_rate, 4),
                "samples": stats.samples,
                "fallback": config.routing.pools[pool].fallback,
            }
        )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'pool':<14}{'state':<11}{'for':>9}  {'p95':>8}  {'errors':>7}  {'samples':>7}  reason"]
    for r in rows:
        p95 = "-" if r["p95_s"] is None else f"{r['p95_s']:.3f}s"
        held = "-" if r["for_s"] is None else f"{r['for_s']}s"
        lines.append(
            f"{r['pool']:<14}{r['state']:<11}{held:>9}  {p95:>8}  {r['error_rate']:>7.1%}  "
            f"{r['samples']:>7}  {r['reason']}"
        )
    return "\n".join(lines)


async def force(client: Client, config: Config, pool: str, phase: Phase, now: float) -> BreakerState:
    prefix = config.breaker.key_prefix
    for _ in range(10):
        current = await shared.read_state(client, prefix, pool)
        version = -1 if current is None else current.version
        new = BreakerState(phase, now, version + 1, "forced by an operator")
        if await shared.write_state(client, prefix, pool, version, new):
            return new
    raise RuntimeError(f"the state of {pool!r} kept changing; try again")


async def _run(client: Client, args: argparse.Namespace, config: Config) -> int:
    try:
        if args.action == "force":
            if args.pool not in config.routing.pools:
                print(
                    f"unknown pool {args.pool!r}; pools: {', '.join(config.routing.pools)}", file=sys.stderr
                )
                return 2
            new = await force(client, config, args.pool, Phase(args.state), time.time())
            print(f"{args.pool}: {new.phase.value} (version {new.version})")
            return 0
        rows = await status(client, config, time.time())
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() if args.json else render(rows))
        return 0
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate breaker", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["status", "force"])
    parser.add_argument("pool", nargs="?", help="force: the pool")
    parser.add_argument("state", nargs="?", choices=[p.value for p in Phase], help="force: the new state")
    parser.add_argument("--redis", help="Redis URL (default: store.redis or store.redis_url of --config)")
    parser.add_argument("--config", type=Path, help="the gates' YAML config (pools, breaker settings)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = load_config_or_report(args.config)
    if config is None:
        return 2
    client = admin_client(args.redis, config.store)
    if client is None:
        parser.error("no Redis: pass --redis URL or a --config with store.redis or store.redis_url")
    if args.action == "force" and (args.pool is None or args.state is None):
        parser.error("force needs POOL and STATE")
    try:
        return asyncio.run(_run(client, args, config))
    except (OSError, aioredis.RedisError) as exc:
        where = args.redis or (config.store.topology.describe() if config.store.topology else "?")
        print(f"cannot reach Redis at {where}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
