"""Rollout state and per-version windows in Redis, shared by every gate process and replica.

State: one JSON value per model, changed only by compare-and-set on its version, so
one process makes each step or rollback (and sends the webhook) and
the others adopt it on their next tick. Windows: the breaker's slice hashes, one series
per model version (`{prefix}{model}/{version}:w:{slice}`), summed over all processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from ..breaker import shared as slices
from ..breaker.window import Slice
from ..redis_client import Client
from .rollout import RolloutState

PHASES = ("rolling", "done", "rolled_back", "manual")

# KEYS[1] state key; ARGV[1] expected version (-1: no state yet); ARGV[2] new JSON. Unlike the
# breaker's, a missing key takes only a writer that expected none: two processes starting a
# rollout at once make one start, not two.
CAS = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and tonumber(doc['version']) ~= tonumber(ARGV[1]) then return 0 end
elseif tonumber(ARGV[1]) ~= -1 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


def state_key(prefix: str, model: str) -> str:
    return f"{prefix}{model}:state"


def series(model: str, version: str) -> str:
    """The window series of one version (the breaker's helpers call it a pool)."""
    return f"{model}/{version}"


def encode(state: RolloutState) -> bytes:
    return orjson.dumps(
        {"canary": state.canary, "phase": state.phase, "weight": state.weight, "step": state.step,
         "since": state.since, "version": state.version, "reason": state.reason}
    )


def decode(raw: bytes | str | None) -> RolloutState | None:
    if raw is None:
        return None
    try:
        doc: Any = orjson.loads(raw)
        phase = str(doc["phase"])
        if phase not in PHASES:
            return None
        return RolloutState(
            str(doc["canary"]), phase, float(doc["weight"]), int(doc["step"]),  # type: ignore[arg-type]
            float(doc["since"]), int(doc["version"]), str(doc.get("reason", "")),
        )
    except (orjson.JSONDecodeError, KeyError, ValueError, TypeError):
        return None


async def read_state(redis: Client, prefix: str, model: str) -> RolloutState | None:
    return decode(await redis.get(state_key(prefix, model)))


async def write_state(
    redis: Client, prefix: str, model: str, expected: int, new: RolloutState
) -> bool:
    """Compare-and-set: True when `new` replaced the state at version `expected` (-1: none)."""
    done = await redis.eval(CAS, 1, state_key(prefix, model), expected, encode(new))
    return bool(done)


async def push(
    redis: Client, prefix: str, model: str, version: str, pending: dict[int, Slice], ttl_s: int
) -> None:
    await slices.push(redis, prefix, series(model, version), pending, ttl_s)


async def read_window(
    redis: Client, prefix: str, model: str, version: str, span: Iterable[int]
) -> list[Slice]:
    return await slices.read_slices(redis, prefix, series(model, version), span)
