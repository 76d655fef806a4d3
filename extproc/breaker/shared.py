"""Breaker state and windows in Redis, shared by every gate process and replica.

Windows: each process adds its new counts into one hash per pool and time slice
(`HINCRBY`), so a slice in Redis is the sum over all processes; every process reads the
slices of the window back and decides on the merged histogram. State: one JSON value per
pool, changed only by compare-and-set on its version, so one process wins each transition
(and sends the webhook); the others adopt it on their next poll (≤ sync_interval_s).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from ..redis_client import Client
from .state import BreakerState, Phase
from .window import Slice

ERRORS_FIELD = b"e"

# KEYS[1] state key; ARGV[1] expected version; ARGV[2] new JSON. A missing key (fresh or
# flushed Redis) accepts any writer.
CAS = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and tonumber(doc['version']) ~= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


def state_key(prefix: str, pool: str) -> str:
    return f"{prefix}{{{pool}}}:state"


def slice_key(prefix: str, pool: str, index: int) -> str:
    """A pool's keys share its name as hash tag: one slot of a Cluster, one node per sync."""
    return f"{prefix}{{{pool}}}:w:{index}"


def encode_state(state: BreakerState) -> bytes:
    doc = {"phase": state.phase.value, "since": state.since, "version": state.version, "reason": state.reason}
    return orjson.dumps(doc)


def decode_state(raw: bytes | str | None) -> BreakerState | None:
    if raw is None:
        return None
    try:
        doc: Any = orjson.loads(raw)
        return BreakerState(Phase(doc["phase"]), float(doc["since"]), int(doc["version"]), str(doc["reason"]))
    except (orjson.JSONDecodeError, KeyError, ValueError, TypeError):
        return None


def decode_slice(raw: dict[bytes, bytes]) -> Slice:
    part = Slice()
    for name, value in raw.items():
        if name == ERRORS_FIELD:
            part.errors = int(value)
        else:
            part.buckets[int(name)] = int(value)
    return part


async def push(redis: Client, prefix: str, pool: str, pending: dict[int, Slice], ttl_s: int) -> None:
    if not pending:
        return
    pipe = redis.pipeline(transaction=False)
    for index, part in pending.items():
        key = slice_key(prefix, pool, index)
        for bucket, count in part.buckets.items():
            pipe.hincrby(key, str(bucket), count)
        if part.errors:
            pipe.hincrby(key, ERRORS_FIELD, part.errors)
        pipe.expire(key, ttl_s)
    await pipe.execute()


async def read_slices(redis: Client, prefix: str, pool: str, span: Iterable[int]) -> list[Slice]:
    pipe = redis.pipeline(transaction=False)
    for index in span:
        pipe.hgetall(slice_key(prefix, pool, index))
    return [decode_slice(raw) for raw in await pipe.execute() if raw]


async def read_state(redis: Client, prefix: str, pool: str) -> BreakerState | None:
    return decode_state(await redis.get(state_key(prefix, pool)))


async def write_state(
    redis: Client, prefix: str, pool: str, expected_version: int, new: BreakerState
) -> bool:
    """Compare-and-set: True when `new` replaced the state at `expected_version`."""
    done = await redis.eval(CAS, 1, state_key(prefix, pool), expected_version, encode_state(new))
    return bool(done)
