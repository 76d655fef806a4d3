"""`llm-gate blocks`: list the callers blocked for repeating a prompt, or lift a block."""

from __future__ import annotations

import argparse
import asyncio

import redis.asyncio as aioredis

from .store import RedisStore


async def run(url: str, prefix: str, action: str, caller: str | None) -> int:
    client = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
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
    parser.add_argument("--redis", required=True, help="the gate's store.redis_url")
    parser.add_argument("--prefix", default="gate:rl:", help="ratelimit.key_prefix")
    args = parser.parse_args(argv)
    if args.action == "lift" and not args.caller:
        parser.error("lift needs the caller to unblock")
    return asyncio.run(run(args.redis, args.prefix, args.action, args.caller))


if __name__ == "__main__":
    raise SystemExit(main())
