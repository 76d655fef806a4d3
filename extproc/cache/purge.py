"""`llm-gate cache-purge`: drop cached answers by tenant, model, or one key.

The key is the value of the `x-gate-cache-key` response header (`<scope>.<key>`). Purges act
on the shared Redis store; the in-process store lives and dies with each gate process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import redis.asyncio as aioredis

from ..config import load_config_or_report
from ..redis_client import Client
from ..redis_conn import admin_client
from .redis_store import RedisStore
from .store import Store


async def purge_from(store: Store, tenant: str | None, model: str | None, key: str | None) -> int:
    """Drop one entry by its `x-gate-cache-key` (`scope.key`), or every entry of a tenant/model."""
    if key is not None:
        scope, _, entry = key.partition(".")
        return await store.purge(scope=scope, key=entry)
    return await store.purge(tenant=tenant, model=model)


async def purge(client: Client, tenant: str | None, model: str | None, key: str | None) -> int:
    store = RedisStore(client)
    try:
        return await purge_from(store, tenant, model, key)
    finally:
        await store.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate cache-purge", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, help="gate config (for store.redis_url)")
    parser.add_argument("--redis-url", help="overrides the config's store.redis_url")
    parser.add_argument("--tenant", help="every answer cached for this tenant ('*': the shared scope)")
    parser.add_argument("--model", help="every answer of this model (with --tenant: of both)")
    parser.add_argument("--key", help="one answer: the x-gate-cache-key header of a response")
    args = parser.parse_args(argv)
    if args.key is None and args.tenant is None and args.model is None:
        parser.error("say what to purge: --tenant, --model, or --key")
    if args.key is not None and "." not in args.key:
        parser.error("--key takes the x-gate-cache-key header value: <scope>.<key>")
    store = None
    if args.redis_url is None:
        config = load_config_or_report(args.config)
        if config is None:
            return 2
        store = config.store
    client = admin_client(args.redis_url, store)
    if client is None:
        print("no store.redis: the in-process cache lives in each gate process; restarting the gate "
              "empties it", file=sys.stderr)
        return 2
    try:
        dropped = asyncio.run(purge(client, args.tenant, args.model, args.key))
    except (OSError, aioredis.RedisError) as exc:
        where = args.redis_url or (store.topology.describe() if store and store.topology else "?")
        print(f"cannot reach the store at {where}: {exc}", file=sys.stderr)
        return 1
    print(f"purged {dropped} cached answer(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
