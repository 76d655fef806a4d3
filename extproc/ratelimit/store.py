"""Where buckets live: in this process (`MemoryStore`) or in Redis (`RedisStore`).

Both run `check.evaluate`'s algorithm: the memory store calls it, the Redis store runs
`ratelimit.lua`, one atomic EVALSHA per request whatever the number of buckets, so every
gate replica sees the same buckets. On a Redis Cluster one request's buckets live in
different slots: each is checked and charged in its own slot (`slots.py` says how, and
what that gives up).

Every key carries a hash tag (`{...}`): a bucket its owner, the repeat window and the block
the caller, so what one script touches is always in one slot.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from ..redis_client import Client, is_cluster
from .check import BucketSpec, Check, State, Status, Verdict, evaluate
from .gcra import Decision
from .slots import REFUND, check_by_slot, slot_tag

LUA = resources.files(__package__).joinpath("ratelimit.lua").read_text(encoding="utf-8")
STATUSES: tuple[Status, ...] = ("allowed", "limited", "blocked")
BLOCK = "block:"
DONE_TTL_US = 10_000_000  # a repeated check within this long gets the first one's verdict


def wall_clock_us() -> int:
    return time.time_ns() // 1000


def tag(text: str) -> str:
    """`text` made safe inside a hash tag: `{`, `}` and `%` percent-encoded (reversible)."""
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def untag(text: str) -> str:
    return text.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


def tagged(prefix: str, kind: str, *parts: str) -> str:
    """`<prefix><kind>:{<parts joined by ':'>}`: the parts are the key's slot."""
    return f"{prefix}{kind}:{{{':'.join(tag(p) for p in parts)}}}"


def block_key(prefix: str, caller: str) -> str:
    return f"{prefix}{BLOCK}{{{tag(caller)}}}"


def caller_of(key: str, prefix: str) -> str:
    return untag(key[len(prefix + BLOCK):].removeprefix("{").removesuffix("}"))


@dataclass(frozen=True)
class Block:
    caller: str
    left: int  # microseconds
    info: str


class LimitStore(Protocol):
    async def check(self, check: Check, now: int | None = None) -> Verdict:
        """Run one check atomically; `now` (microseconds) defaults to the store's clock."""
        ...

    async def blocks(self) -> list[Block]: ...

    async def lift(self, caller: str) -> bool: ...


class MemoryStore:
    """One process only: for the embedded gate and for tests."""

    def __init__(
        self, prefix: str = "gate:rl:", clock: Callable[[], int] = wall_clock_us, sweep_every: int = 4096
    ) -> None:
        self.prefix = prefix
        self.clock = clock
        self.tats: dict[str, int] = {}
        self.histories: dict[str, tuple[int, ...]] = {}
        self.windows: dict[str, int] = {}
        self.held: dict[str, tuple[int, str]] = {}
        self.done: dict[str, tuple[int, Verdict]] = {}  # done key -> (until, verdict)
        self._calls = 0
        self.sweep_every = sweep_every

    async def check(self, check: Check, now: int | None = None) -> Verdict:
        now = self.clock() if now is None else now
        if check.done_key is not None:
            kept = self.done.get(check.done_key)
            if kept is not None and kept[0] > now:
                return kept[1]
        verdict = self._check(check, now)
        if check.done_key is not None:
            self.done[check.done_key] = (now + DONE_TTL_US, verdict)
        return verdict

    def _check(self, check: Check, now: int) -> Verdict:
        repeat = check.repeat
        held = self.held.get(repeat.block_key) if repeat else None
        state = State(
            tats=tuple(self.tats.get(b.key) for b in check.buckets),
            history=self.histories.get(repeat.key, ()) if repeat else (),
            block_until=held[0] if held else None,
        )
        out = evaluate(check, state, now)
        if repeat is not None:
            if out.history is not None:
                self.histories[repeat.key] = out.history
                self.windows[repeat.key] = repeat.window
            if out.block_until is not None:
                self.held[repeat.block_key] = (out.block_until, repeat.info)
        if out.tats is not None:
            self.tats.update(zip((b.key for b in check.buckets), out.tats, strict=True))
        self._sweep(now)
        return out.verdict

    def _sweep(self, now: int) -> None:
        """Forget what no longer matters: full buckets, old arrivals, ended blocks."""
        self._calls += 1
        if self._calls % self.sweep_every:
            return
        self.tats = {k: v for k, v in self.tats.items() if v > now}
        self.held = {k: v for k, v in self.held.items() if v[0] > now}
        self.done = {k: v for k, v in self.done.items() if v[0] > now}
        self.histories = {
            k: v for k, v in self.histories.items() if v and v[-1] > now - self.windows.get(k, 0)
        }
        self.windows = {k: v for k, v in self.windows.items() if k in self.histories}

    async def blocks(self) -> list[Block]:
        now = self.clock()
        return [
            Block(caller_of(key, self.prefix), until - now, info)
            for key, (until, info) in sorted(self.held.items())
            if until > now
        ]

    async def lift(self, caller: str) -> bool:
        return self.held.pop(block_key(self.prefix, caller), None) is not None


class RedisStore:
    def __init__(self, redis: Client, prefix: str = "gate:rl:") -> None:
        self.redis = redis
        self.prefix = prefix
        self.script = redis.register_script(LUA)
        self.refund_script = redis.register_script(REFUND)
        self.by_slot = is_cluster(redis)

    async def check(self, check: Check, now: int | None = None) -> Verdict:
        if self.by_slot:
            return await check_by_slot(self._check, self._refund, check, now)
        return await self._check(check, now)

    async def _refund(self, bucket: BucketSpec, part: str | None, now: int | None) -> None:
        mark = f"{{{slot_tag(bucket.key)}}}:refund:{part or uuid.uuid4().hex}"
        args = ["" if now is None else now, bucket.interval, bucket.cost, DONE_TTL_US // 1000]
        await self.refund_script(keys=[bucket.key, mark], args=args)

    async def _check(self, check: Check, now: int | None = None) -> Verdict:
        keys = [b.key for b in check.buckets]
        keep_ms = DONE_TTL_US // 1000 if check.done_key else 0
        args: list[Any] = ["" if now is None else now, len(check.buckets), keep_ms]
        repeat = check.repeat
        if repeat is None:
            args.append(0)
        else:
            keys += [repeat.key, repeat.block_key]
            args += [1, repeat.limit, repeat.window, repeat.block, repeat.info]
        if check.done_key:
            keys.append(check.done_key)
        for b in check.buckets:
            args += [b.interval, b.tolerance, b.cost]
        reply = await self.script(keys=keys, args=args)
        return parse_reply([int(x) for x in reply])

    async def blocks(self) -> list[Block]:
        now = wall_clock_us()
        found: list[Block] = []
        async for raw in self.redis.scan_iter(match=self.prefix + BLOCK + "*", count=500):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            value = await self.redis.get(key)
            if value is None:
                continue
            text = value.decode() if isinstance(value, bytes) else str(value)
            until, _, info = text.partition("|")
            if int(until) > now:
                found.append(Block(caller_of(key, self.prefix), int(until) - now, info))
        return sorted(found, key=lambda b: b.caller)

    async def lift(self, caller: str) -> bool:
        return bool(await self.redis.delete(block_key(self.prefix, caller)))


def parse_reply(reply: list[int]) -> Verdict:
    status, block_left, newly = reply[:3]
    rest = reply[3:]
    decisions = tuple(
        Decision(bool(rest[i]), None, rest[i + 1], rest[i + 2], rest[i + 3]) for i in range(0, len(rest), 4)
    )
    return Verdict(STATUSES[status], decisions, block_left, bool(newly))
