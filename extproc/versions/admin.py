"""`llm-gate versions`: the canaries as the gates share them, and an operator's hand on them.

    llm-gate versions status [--json]             every versioned model: weights, rollout, windows
    llm-gate versions set-weight chat 15          the canary at 15% (a rollout in progress stops)
    llm-gate versions promote chat                the canary at 100%
    llm-gate versions rollback chat               the canary at 0%
    llm-gate versions start chat                  start the model's rollout again from its first step

All take `--config gate.yaml` (the gates' file: models, versions, rollout settings) and
`--redis URL` (default: its store.redis_url). A change is a new state version written by
compare-and-set; every gate process adopts it within `routing.version_sync.interval_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from ..breaker.window import Window, summarize
from ..config import Config, Routing, load_config_or_report
from . import shared
from .choose import shares
from .rollout import RolloutState, begin
from .settings import Rollout, VersionedModel

Change = Callable[[RolloutState | None, str, float], RolloutState]


def set_weight(weight: float, phase: str = "manual", reason: str = "") -> Change:
    def change(current: RolloutState | None, canary: str, now: float) -> RolloutState:
        version = -1 if current is None else current.version
        return RolloutState(canary, phase, weight, 0, now, version + 1,  # type: ignore[arg-type]
                            reason or f"set to {weight:g}% by an operator")

    return change


def restart(rollout: Rollout) -> Change:
    def change(current: RolloutState | None, canary: str, now: float) -> RolloutState:
        version = -1 if current is None else current.version
        return begin(canary, rollout, now, version + 1)

    return change


async def write(
    client: aioredis.Redis, routing: Routing, model: str, change: Change, now: float
) -> RolloutState:
    versioned = routing.versions[model]
    assert versioned.canary is not None
    prefix = routing.version_sync.key_prefix
    for _ in range(10):
        current = await shared.read_state(client, prefix, model)
        new = change(current, versioned.canary.name, now)
        expected = -1 if current is None else current.version
        if await shared.write_state(client, prefix, model, expected, new):
            return new
    raise RuntimeError(f"the state of {model!r} kept changing; try again")


async def status(client: aioredis.Redis, routing: Routing, now: float) -> list[dict[str, Any]]:
    prefix = routing.version_sync.key_prefix
    rows = []
    for name, model in routing.versions.items():
        state = await shared.read_state(client, prefix, name) if model.canary is not None else None
        if state is not None and model.canary is not None and state.canary != model.canary.name:
            state = None
        table = shares(model, canary_weight=state.weight if state is not None else None)
        since = state.since if state is not None else now - (model.rollout or Rollout()).window_s
        rows.append({
            "model": name,
            "phase": state.phase if state is not None else "config",
            "for_s": round(now - state.since, 1) if state is not None else None,
            "reason": state.reason if state is not None else "the configured weights",
            "versions": [
                {"version": s.name, "pool": s.pool, "canary": s.canary, "share": round(s.share, 4),
                 **await _window(client, prefix, name, model, s.name, since, now)}
                for s in table
            ],
        })
    return rows


async def _window(
    client: aioredis.Redis, prefix: str, model: str, versioned: VersionedModel, version: str, since: float,
    now: float,
) -> dict[str, Any]:
    cfg = versioned.rollout or Rollout()
    window = Window(cfg.window_s, cfg.slices)
    parts = await shared.read_window(client, prefix, model, version, window.span(now, since))
    stats = summarize(parts, window.covered_s(now, since))
    return {"p95_s": stats.p95_s, "error_rate": round(stats.error_rate, 4), "samples": stats.samples}


def render(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        held = "" if r["for_s"] is None else f" for {r['for_s']}s"
        lines.append(f"{r['model']}: {r['phase']}{held} ({r['reason']})")
        for v in r["versions"]:
            p95 = "-" if v["p95_s"] is None else f"{v['p95_s']:.3f}s"
            tag = " canary" if v["canary"] else ""
            lines.append(f"  {v['version']:<10}{v['pool']:<14}{v['share']:>7.1%}  p95 {p95:>8}  "
                         f"errors {v['error_rate']:>6.1%}  samples {v['samples']:>6}{tag}")
    return "\n".join(lines)


async def _run(args: argparse.Namespace, config: Config) -> int:
    client = aioredis.Redis.from_url(args.redis, socket_timeout=2, socket_connect_timeout=2)
    routing = config.routing
    try:
        now = time.time()
        if args.action == "status":
            rows = await status(client, routing, now)
            print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() if args.json else render(rows))
            return 0
        versioned = routing.versions.get(args.model)
        if versioned is None or versioned.canary is None:
            known = ", ".join(m for m, v in routing.versions.items() if v.canary is not None) or "none"
            print(f"{args.model!r} is not a model with a canary version; those: {known}", file=sys.stderr)
            return 2
        if args.action == "set-weight":
            change = set_weight(args.percent)
        elif args.action == "promote":
            change = set_weight(100.0, "done", "promoted by an operator")
        elif args.action == "rollback":
            change = set_weight(0.0, "rolled_back", "rolled back by an operator")
        else:
            if versioned.rollout is None:
                print(f"{args.model!r} has no rollout in routing.versions", file=sys.stderr)
                return 2
            change = restart(versioned.rollout)
        new = await write(client, routing, args.model, change, now)
        print(f"{args.model}: canary {new.canary} at {new.weight:g}% "
              f"({new.phase}, state version {new.version})")
        return 0
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate versions", description=__doc__.splitlines()[0])
    parser.add_argument(
        "action", choices=["status", "set-weight", "promote", "rollback", "start"],
        help="status: weights, rollout and windows; set-weight: the canary's share; promote: 100%%; "
        "rollback: 0%%; start: the rollout again from its first step",
    )
    parser.add_argument("model", nargs="?", help="the model (routing.versions)")
    parser.add_argument("percent", nargs="?", type=float, help="set-weight: the canary's share, 0-100")
    parser.add_argument("--redis", help="Redis URL (default: store.redis_url of --config)")
    parser.add_argument("--config", type=Path, help="the gates' YAML config")
    parser.add_argument("--json", action="store_true", help="status as JSON")
    args = parser.parse_args(argv)
    config = load_config_or_report(args.config)
    if config is None:
        return 2
    args.redis = args.redis or config.store.redis_url
    if not args.redis:
        parser.error("no Redis: pass --redis URL or a --config with store.redis_url")
    if args.action != "status" and args.model is None:
        parser.error(f"{args.action} needs MODEL")
    if args.action == "set-weight" and (args.percent is None or not 0 <= args.percent <= 100):
        parser.error("set-weight needs PERCENT between 0 and 100")
    try:
        return asyncio.run(_run(args, config))
    except (OSError, aioredis.RedisError) as exc:
        print(f"cannot reach Redis at {args.redis}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
