"""`llm-gate dedup status`: every self-calibration bin as the gates share it.

    llm-gate dedup status [--config gate.yaml] [--redis redis://host:6379/0] [--json]

One line per (tenant, language, verifier-score bin): live checks, how many agreed, the bin's
prior (where the shipped evaluation's evidence proves the target, just enough of it to
serve: where every tenant starts, listed as tenant `*`), the precision and 95% lower bound
of both together, and whether the bin serves semantic hits or is still learning (its bound
under the target, or fewer checks than `min_checks`). The counts live in Redis
(`store.redis_url`); without Redis each gate process keeps its own, shown by its metrics
(`gate_cache_selfcheck_lower_bound`, `gate_cache_selfcheck_serving`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
from redis.exceptions import RedisError

from ..config import Config, load_config_or_report
from ..dedup.selfcheck import Counts, verdict
from ..redis_conn import admin_client
from .bins import BinStore, RedisBins
from .selfcheck import priors
from .setup import semantic_policy


def target_of(config: Config) -> float:
    s = config.cache.semantic
    return s.self_check.target if s.self_check.target is not None else s.target_precision


def shipped_priors(config: Config) -> dict[str, dict[str, Counts]]:
    """Each language's bins' priors, from the calibration files the gates read."""
    s = config.cache.semantic
    try:
        return priors(semantic_policy(s), s.self_check, target_of(config))
    except (FileNotFoundError, ValueError):
        return {}


def _row(tenant: str, language: str, bin: str, live: Counts, start: Counts, target: float,
         min_checks: int) -> dict[str, Any]:
    both = live + start
    return {
        "tenant": tenant,
        "language": language,
        "bin": bin,
        "checks": live.checks,
        "agreed": live.agreed,
        "prior_checks": start.checks,
        "prior_agreed": start.agreed,
        "precision": round(both.precision, 4),
        "lower_bound": round(both.lower, 4),
        "state": "serving" if verdict(both, target, min_checks) == "serve" else "learning",
    }


async def status(bins: BinStore, config: Config) -> list[dict[str, Any]]:
    sc, target, start = config.cache.semantic.self_check, target_of(config), shipped_priors(config)
    rows = [
        _row("*", lang, name, Counts(), counts, target, sc.min_checks)
        for lang, by_bin in sorted(start.items()) for name, counts in sorted(by_bin.items())
    ]
    for r in await bins.rows():
        prior_counts = start.get(r.language, {}).get(r.bin, Counts())
        rows.append(_row(r.tenant, r.language, r.bin, r.counts, prior_counts, target, sc.min_checks))
    return rows


def render(rows: list[dict[str, Any]], target: float) -> str:
    lines = [f"{'tenant':<16}{'lang':<6}{'bin':>6}{'checks':>8}{'agreed':>8}{'prior':>10}{'precision':>11}"
             f"{'lower':>8}  state"]
    for r in rows:
        prior_text = f"{r['prior_agreed']}/{r['prior_checks']}"
        lines.append(
            f"{r['tenant']:<16}{r['language'] or '-':<6}{r['bin']:>6}{r['checks']:>8}{r['agreed']:>8}"
            f"{prior_text:>10}{r['precision']:>11.3f}{r['lower_bound']:>8.3f}  {r['state']}"
        )
    if not rows:
        lines.append("(no checks yet)")
    lines.append(f"target {target:g}: a bin serves once its lower bound reaches it; tenant * is where every "
                 "tenant starts (the prior alone)")
    return "\n".join(lines)


async def _run(args: argparse.Namespace, config: Config) -> int:
    client = admin_client(args.redis, config.store)
    if client is None:
        print("no Redis (store.redis, store.redis_url or --redis): each gate process keeps its own counts; "
              "read gate_cache_selfcheck_* on its metrics port", file=sys.stderr)
        return 1
    try:
        rows = await status(RedisBins(client, config.cache.semantic.self_check.key_prefix), config)
    except RedisError as exc:
        print(f"cannot read the bins from Redis: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.aclose()
    text = orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() if args.json else None
    print(text or render(rows, target_of(config)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llm-gate dedup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["status"], help="status: print every bin")
    p.add_argument("--config", type=Path, help="the gate's YAML config (target, min_checks, Redis URL)")
    p.add_argument("--redis", help="Redis URL (default: the config's store.redis_url)")
    p.add_argument("--json", action="store_true", help="one JSON object per bin")
    args = p.parse_args(argv)
    config = load_config_or_report(args.config)
    if config is None:
        return 2
    return asyncio.run(_run(args, config))


if __name__ == "__main__":
    raise SystemExit(main())
