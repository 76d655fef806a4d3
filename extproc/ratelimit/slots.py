"""One request's rate-limit check when its buckets live in different slots (Redis Cluster).

A request counts against up to four buckets (tenant, user, IP, route) and a caller's
repeated-prompt window; on a Cluster each sits in the slot of its own hash tag, and no
script may span slots. So, as Envoy's ratelimit service does, each bucket is checked and
charged on its own, atomically in its slot:

1. the caller's repeat window and block (one slot: both carry the caller as hash tag) —
   a block answers at once and charges no bucket;
2. the buckets one after the other, the most specific first (user, IP, then tenant and
   route): each is charged if it admits the request, and the first that denies it ends
   the check (the ones after it are not asked, so a denied request reaches the shared
   buckets only when its own ones had room);
3. the buckets that charged a request another bucket denied are refunded (their TAT
   moved back one cost, never before now), so a denied request costs nothing in the end,
   as with the one-script check on a single node.

What this gives up is atomicity across buckets, never a bucket's own bound: each bucket's
script is atomic, so no bucket ever admits more than `rate × t + burst` (no
over-admission). Between a charge and its refund the charge holds a place, so under
concurrency a request may be denied by a bucket that an instant later would have had room
(under-admission, bounded by the requests in flight and confined to the specific buckets
of the callers that hit a shared limit). A refund lost with its process leaves that bucket
charged for one request more than it admitted, until it refills. A request takes one round
trip per bucket it reaches. `tests/ratelimit/test_slots.py` measures this under concurrency.

Every step is idempotent by the request: each slot keeps the verdict of its part under its
own key (`<done key>:{<tag>}`), and a refund is made once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .check import BucketSpec, Check, RepeatSpec, Verdict
from .gcra import Decision

ORDER = ("user", "ip", "tenant", "route")
NOT_ASKED = Decision(True, None, 0, 0, 0)

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
    decisions: list[Decision | None] = [None] * len(check.buckets)
    charged: list[BucketSpec] = []
    denied = False
    for i in sorted(range(len(check.buckets)), key=lambda i: specificity(check.buckets[i])):
        bucket = check.buckets[i]
        part = await run_one(Check((bucket,), None, part_key(check.done_key, bucket.key)), now)
        decisions[i] = part.decisions[0]
        if not part.decisions[0].allowed:
            denied = True
            break
        charged.append(bucket)
    if not denied:
        return Verdict("allowed", tuple(d for d in decisions if d is not None))
    await asyncio.gather(*(refund(b, part_key(check.done_key, b.key), now) for b in charged))
    # A bucket not asked reports room and no wait: the one that denied is the tightest.
    return Verdict("limited", tuple(d if d is not None else NOT_ASKED for d in decisions))


def specificity(bucket: BucketSpec) -> int:
    """Order of asking: a caller's own buckets before the ones it shares with others."""
    return ORDER.index(bucket.name) if bucket.name in ORDER else len(ORDER)
