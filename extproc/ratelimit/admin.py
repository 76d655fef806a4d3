"""`llm-gate blocks`: list the callers blocked for repeating a prompt, or lift a block."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from ..config import load_config_or_report
from ..redis_client import Client
from ..redis_conn import admin_client
from .store import RedisStore


async def run(client: Client, prefix: str, action: str, caller: str | None) -> int:
    try:
        store = RedisStore(client, prefix)
        if action == "lift":
            assert caller is not None
            lifted = await store.lift(caller)
            print(f"lifted {caller}" if lifted else f"no block for {caller}")
            return 0 if lifted else 1
        blocks = await store.blocks()
        for b in blocks:
            print(f"{b.caller}\t{b.left / 1e6:.1f}s left\t{b.info}")
        if not blocks:
            print("no blocks")
        return 0
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate blocks", description=__doc__)
    parser.add_argument("action", nargs="?", choices=["list", "lift"], default="list",
                        help="list the blocks (default) or lift one")
    parser.add_argument("caller", nargs="?", help="the caller to lift, as `list` shows it")
    parser.add_argument("--redis", help="a Redis URL (default: store.redis or store.redis_url of --config)")
    parser.add_argument("--config", type=Path, help="the gate's YAML config (its store and key prefix)")
    parser.add_argument("--prefix", help="ratelimit.key_prefix (default: the config's, else gate:rl:)")
    args = parser.parse_args(argv)
    if args.action == "lift" and not args.caller:
        parser.error("lift needs the caller to unblock")
    config = load_config_or_report(args.config) if args.config else None
    if args.config and config is None:
        return 2
    client = admin_client(args.redis, config.store if config else None)
    if client is None:
        parser.error("no Redis: pass --redis URL or a --config with store.redis or store.redis_url")
    prefix = args.prefix or (config.ratelimit.key_prefix if config else "gate:rl:")
    return asyncio.run(run(client, prefix, args.action, args.caller))


if __name__ == "__main__":
    raise SystemExit(main())
