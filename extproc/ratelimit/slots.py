"""One request's rate-limit check when its buckets live in different slots (Redis Cluster).

A request counts against up to four buckets (tenant, user, IP, route) and a caller's
repeated-prompt window; on a Cluster each sits in the slot of its own hash tag, and no
script may span slots. So, as Envoy's ratelimit service does, each bucket is checked and
charged on its own, atomically in its slot:

1. the caller's repeat window and block (one slot: both carry the caller as hash tag) —
   a block answers at once and charges no bucket;
2. every bucket at once, each charged if it admits the request;
3. when any bucket denies it, the buckets that charged it are refunded (their TAT moved
   back one cost, never before now), so a denied request costs nothing in the end, as
   with the one-script check on a single node.

What this gives up is atomicity across buckets, never a bucket's own bound: each bucket's
script is atomic, so no bucket ever admits more than `rate × t + burst` (no over-admission).
Between step 2 and 3 a charge that is about to be refunded holds its place, so under
concurrency a request may be denied by a bucket that, an instant later, would have had room
(under-admission, bounded by the requests in flight). A refund lost with its process
leaves that bucket charged for one request more than it admitted, until it refills.
`tests/ratelimit/test_slots.py` measures both under concurrency.

Every step is idempotent by the request: each slot keeps the verdict of its part under its
own key (`<done key>:{<tag>}`), and a refund is made once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .check import BucketSpec, Check, RepeatSpec, Verdict

# KEYS[1] the bucket, KEYS[2] the refund's mark. ARGV: now_us ('' = Redis TIME), interval_us,
# cost, keep_ms. Moves the TAT back by cost x interval, never before now; once per mark.
REFUND = """
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[4]) == false then return 0 end
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat <= now then return 1 end
local new_tat = math.max(now, tat - tonumber(ARGV[2]) * tonumber(ARGV[3]))
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.floor((new_tat - now) / 1000) + 1000)
return 1
"""

RunOne = Callable[[Check, "int | None"], Awaitable[Verdict]]
Refund = Callable[[BucketSpec, str | None, "int | None"], Awaitable[None]]


def slot_tag(key: str) -> str:
    """What Redis hashes to place `key`: the first non-empty `{...}`, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    if "}" in key:
        raise ValueError(f"key {key!r} has a '}}' but no hash tag: its slot cannot be named")
    return key


def part_key(done_key: str | None, key: str) -> str | None:
    """Where one slot keeps its part of a request's verdict: in `key`'s slot."""
    return None if done_key is None else f"{done_key}:{{{slot_tag(key)}}}"


def check_repeat_slot(repeat: RepeatSpec) -> None:
    if slot_tag(repeat.key) != slot_tag(repeat.block_key):
        raise ValueError(f"{repeat.key!r} and {repeat.block_key!r} must share a hash tag (one slot)")


async def check_by_slot(run_one: RunOne, refund: Refund, check: Check, now: int | None) -> Verdict:
    """`check` as one script per slot (see the module's docstring for the semantic)."""
    repeat = check.repeat
    if repeat is not None:
        check_repeat_slot(repeat)
        first = await run_one(Check((), repeat, part_key(check.done_key, repeat.block_key)), now)
        if first.status == "blocked":
            return first
    parts = await asyncio.gather(
        *(run_one(Check((b,), None, part_key(check.done_key, b.key)), now) for b in check.buckets)
    )
    decisions = tuple(p.decisions[0] for p in parts)
    if all(d.allowed for d in decisions):
        return Verdict("allowed", decisions)
    await asyncio.gather(*(
        refund(b, part_key(check.done_key, b.key), now)
        for b, d in zip(check.buckets, decisions, strict=True) if d.allowed
    ))
    return Verdict("limited", decisions)
