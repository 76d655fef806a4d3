"""The cache store on plain Redis (no modules): one Lua script per atomic step.

Every key of a scope carries the scope as its hash tag (`gate:c:{<scope>}:...`), so a
scope lives in one slot of a Redis Cluster and each script touches one slot.

  e:<key>     the entry (PX ttl)            l:<key>   the lease: the leader's token (PX)
  a:<key>     how long the last attempt whose client gave up waited (ms, PX a minute)
  t:<key>     the question of a request in flight, announced by its leader (PX; `pend`)
  z           key -> expiry ms (size bound and live check)
  v / s       key -> vector bytes / the key's band names
  q:<band>    one LSH bucket: key -> expiry ms, capped at the newest `band_cap` keys, so a
              candidates call reads at most bands x band_cap members however skewed the traffic
              (a bucket of template prompts would otherwise hold most of the scope)
Outside the scopes: `gate:c:t:<tenant>` and `gate:c:m:<model>` list a tenant's and a model's
scopes, for purges (plain commands, each on its own slot).

Notices (an answer landed, a lease was handed back) wake followers in other processes. On
one node or Sentinel they go out on the channel `gate:c:notices`; on a Cluster, with
sharded pub/sub (SPUBLISH / SSUBSCRIBE), on one of `NOTICE_SHARDS` channels
`gate:c:notices:{<n>}` chosen by the key, so they spread over the masters and never
cross the cluster bus to every node. The listener follows its channels to a new master
after a failover or a slot move (a dropped subscription is made again).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ..redis_client import Client, is_cluster
from .hot import Purged
from .store import Lookup, Pending, Put

PREFIX = "gate:c:"
# Every process listens here: "<scope>.<key>" once an answer landed or a lease was handed back.
NOTICES = "gate:c:notices"
NOTICE_SHARDS = 16
# A sharded listener polls one master's connection at a time: this long on each.
SHARD_POLL_S = 0.02

_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

_DROP = """
local function drop(p, k)
  redis.call('DEL', p .. 'e:' .. k, p .. 't:' .. k)
  local sigs = redis.call('HGET', p .. 's', k)
  if sigs then
    for band in string.gmatch(sigs, '%S+') do redis.call('ZREM', p .. 'q:' .. band, k) end
  end
  redis.call('HDEL', p .. 'v', k)
  redis.call('HDEL', p .. 's', k)
  redis.call('ZREM', p .. 'z', k)
end
"""

LOOKUP = """
local e = redis.call('GET', KEYS[1])
if e then return {'hit', e} end
local held = redis.call('GET', KEYS[2])
if ARGV[1] == '' then
  if held then return {'follower', ''} end
  return {'none', ''}
end
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {'leader', ''}
end
if held then return {'follower', ''} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return {'leader', ''}
"""

CANDIDATES = _NOW + """
local limit, votes, by, out = tonumber(ARGV[1]), {}, {}, {}
for i = 2, #KEYS do
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[i], '(' .. now, '+inf')) do
    votes[k] = (votes[k] or 0) + 1
  end
end
for k, n in pairs(votes) do
  local group = by[n]
  if group then group[#group + 1] = k else by[n] = {k} end
end
for n = #KEYS - 1, 1, -1 do
  local group = by[n]
  if group then
    table.sort(group)
    for _, k in ipairs(group) do
      local v = redis.call('HGET', KEYS[1], k)
      if v then
        out[#out + 1] = k
        out[#out + 1] = v
        if #out >= 2 * limit then return out end
      end
    end
  end
end
return out
"""

_INDEX = """
local function index(p, k, vector, ttl, cap, first)
  redis.call('ZADD', p .. 'z', now + ttl, k)
  redis.call('HSET', p .. 'v', k, vector)
  local names = {}
  for i = first, #ARGV do
    local band = p .. 'q:' .. ARGV[i]
    redis.call('ZADD', band, now + ttl, k)
    redis.call('ZREMRANGEBYSCORE', band, '-inf', now)
    local over = redis.call('ZCARD', band) - cap
    if over > 0 then redis.call('ZREMRANGEBYRANK', band, 0, over - 1) end
    if redis.call('PTTL', band) < ttl then redis.call('PEXPIRE', band, ttl) end
    names[#names + 1] = ARGV[i]
  end
  redis.call('HSET', p .. 's', k, table.concat(names, ' '))
  for _, name in ipairs({'z', 'v', 's'}) do
    if redis.call('PTTL', p .. name) < ttl then redis.call('PEXPIRE', p .. name, ttl) end
  end
end
"""

PUT = _NOW + _DROP + _INDEX + """
local p, k, ttl, token, max = ARGV[1], ARGV[2], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
drop(p, k)
redis.call('SET', p .. 'e:' .. k, ARGV[3], 'PX', ttl)
if token ~= '' and redis.call('GET', p .. 'l:' .. k) == token then redis.call('DEL', p .. 'l:' .. k) end
if ARGV[7] ~= '' then
  index(p, k, ARGV[7], ttl, tonumber(ARGV[8]), 9)
else
  redis.call('ZADD', p .. 'z', now + ttl, k)
  if redis.call('PTTL', p .. 'z') < ttl then redis.call('PEXPIRE', p .. 'z', ttl) end
end
for _, old in ipairs(redis.call('ZRANGEBYSCORE', p .. 'z', '-inf', now, 'LIMIT', 0, 100)) do drop(p, old) end
local over = redis.call('ZCARD', p .. 'z') - max
if over > 0 then
  for _, old in ipairs(redis.call('ZRANGE', p .. 'z', 0, over - 1)) do drop(p, old) end
end
return 1
"""

PEND = _NOW + _DROP + _INDEX + """
local p, k, ttl = ARGV[1], ARGV[2], tonumber(ARGV[4])
if redis.call('EXISTS', p .. 'e:' .. k) == 1 then return 0 end
drop(p, k)
redis.call('SET', p .. 't:' .. k, ARGV[3], 'PX', ttl)
index(p, k, ARGV[5], ttl, tonumber(ARGV[6]), 7)
return 1
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

PURGE_KEY = _DROP + """
if redis.call('ZSCORE', ARGV[1] .. 'z', ARGV[2]) then drop(ARGV[1], ARGV[2]) return 1 end
return 0
"""


def scope_prefix(scope: str) -> str:
    return f"{PREFIX}{{{scope}}}:"


def notice_channel(slot: str) -> str:
    """The sharded channel that carries the notices of `slot` ("<scope>.<key>")."""
    return f"{NOTICES}:{{{zlib.crc32(slot.encode()) % NOTICE_SHARDS}}}"


class RedisStore:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        self._lookup = client.register_script(LOOKUP)
        self._candidates = client.register_script(CANDIDATES)
        self._put = client.register_script(PUT)
        self._pend = client.register_script(PEND)
        self._release = client.register_script(RELEASE)
        self._renew = client.register_script(RENEW)
        self._purge_key = client.register_script(PURGE_KEY)
        self._purge_subscribers: list[Callable[[Purged], None]] = []

    async def lookup(self, scope: str, key: str, token: str | None, lease_ms: int) -> Lookup:
        p = scope_prefix(scope)
        role, entry = await self._lookup(keys=[p + "e:" + key, p + "l:" + key], args=[token or "", lease_ms])
        name = role.decode() if isinstance(role, bytes) else str(role)
        return Lookup(name, entry if name == "hit" else None)  # type: ignore[arg-type]

    async def candidates(self, scope: str, bands: list[str], limit: int) -> list[tuple[str, bytes]]:
        p = scope_prefix(scope)
        keys = [p + "v", *(p + "q:" + b for b in bands)]
        flat: list[Any] = await self._candidates(keys=keys, args=[limit])
        return [(_text(flat[i]), bytes(flat[i + 1])) for i in range(0, len(flat), 2)]

    async def fetch(self, scope: str, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        p = scope_prefix(scope)
        values: list[Any] = await self.client.mget([p + "e:" + k for k in keys])
        return [None if v is None else bytes(v) if not isinstance(v, str) else v.encode() for v in values]

    async def put(self, item: Put) -> None:
        p = scope_prefix(item.scope)
        args: list[Any] = [p, item.key, item.entry, item.ttl_ms, item.token or "", item.max_entries,
                           item.vector or b"", item.band_cap, *item.bands]
        keys = [p + "e:" + item.key, p + "l:" + item.key, p + "z", p + "v", p + "s"]
        if self.cluster:  # the scope's script alone on its slot, then the rest routed per key
            await self._put(keys=keys, args=args)
            await self._put_rest(item, None)
            return
        try:
            await self._put_rest(item, (keys, args))
        except NoScriptError:  # a new or restarted master that never saw the script
            await self.client.script_load(PUT)
            await self._put_rest(item, (keys, args))

    async def _put_rest(self, item: Put, script: tuple[list[str], list[Any]] | None) -> None:
        """The scope indexes and the notice, in one pipeline, after the PUT script when given.

        EVALSHA by hand: a redis-py pipeline that runs a `Script` first asks SCRIPT EXISTS,
        one more round trip on every store.
        """
        pipe: Any
        async with self.client.pipeline(transaction=False) as pipe:
            if script is not None:
                keys, args = script
                pipe.evalsha(self._put.sha, len(keys), *keys, *args)
            for index in (f"{PREFIX}t:{item.tenant}", f"{PREFIX}m:{item.model}"):
                pipe.sadd(index, item.scope)
                pipe.pexpire(index, item.ttl_ms, gt=True)
                pipe.pexpire(index, item.ttl_ms, nx=True)
            if item.token is not None:  # followers elsewhere: the answer is in
                self._notice(pipe, f"{item.scope}.{item.key}")
            await pipe.execute()

    def _notice(self, pipe: Any, slot: str) -> None:
        if self.cluster:
            pipe.spublish(notice_channel(slot), slot)
        else:
            pipe.publish(NOTICES, slot)

    async def pend(self, item: Pending) -> None:
        p = scope_prefix(item.scope)
        keys = [p + "e:" + item.key, p + "t:" + item.key, p + "z", p + "v", p + "s"]
        args: list[Any] = [p, item.key, item.text, item.ttl_ms, item.vector, item.band_cap, *item.bands]
        await self._pend(keys=keys, args=args)

    async def in_flight(self, scope: str, keys: list[str]) -> list[str | None]:
        if not keys:
            return []
        p = scope_prefix(scope)
        values: list[Any] = await self.client.mget([p + "t:" + k for k in keys])
        return [None if v is None else _text(v) for v in values]

    async def release(self, scope: str, key: str, token: str) -> bool:
        """Hand the lease back if `token` holds it; waiters elsewhere then hear of it."""
        released = bool(await self._release(keys=[scope_prefix(scope) + "l:" + key], args=[token]))
        if released:
            pipe: Any
            async with self.client.pipeline(transaction=False) as pipe:
                self._notice(pipe, f"{scope}.{key}")
                await pipe.execute()
        return released

    async def listen(self, wake: Callable[[str], None], idle_s: float = 1.0) -> None:
        """Call `wake(slot)` for every notice, for as long as the process runs; reconnects."""
        while True:
            try:
                if self.cluster:
                    await self._listen_sharded(wake, idle_s)
                else:
                    await self._listen_plain(wake, idle_s)
            except (RedisError, RedisClusterException, OSError):  # a slot without a master, meanwhile
                await asyncio.sleep(idle_s)

    async def _listen_plain(self, wake: Callable[[str], None], idle_s: float) -> None:
        client: Any = self.client
        async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(NOTICES)
            self._resubscribed()
            while True:
                message = await pubsub.get_message(timeout=idle_s)
                if message is not None and message.get("type") == "message":
                    self._heard(_text(message["data"]), wake)

    async def _listen_sharded(self, wake: Callable[[str], None], idle_s: float) -> None:
        client: Any = self.client
        pubsub = client.pubsub()
        try:
            await pubsub.ssubscribe(*(f"{NOTICES}:{{{n}}}" for n in range(NOTICE_SHARDS)))
            self._resubscribed()
            while True:
                message = await pubsub.get_sharded_message(
                    ignore_subscribe_messages=True, timeout=SHARD_POLL_S
                )
                if message is None:
                    if not pubsub.node_pubsub_mapping:  # every subscription was dropped: make them again
                        await asyncio.sleep(idle_s)
                        return
                    await asyncio.sleep(0)  # no node had one: let the loop run before the next round
                elif message.get("type") == "smessage":
                    self._heard(_text(message["data"]), wake)
        finally:
            await pubsub.aclose()

    async def abandon(self, scope: str, key: str, waited_ms: int, ttl_ms: int) -> None:
        await self.client.set(scope_prefix(scope) + "a:" + key, waited_ms, px=ttl_ms)

    async def abandoned(self, scope: str, key: str) -> int | None:
        value = await self.client.get(scope_prefix(scope) + "a:" + key)
        return None if value is None else int(value)

    async def renew(self, scope: str, key: str, token: str, lease_ms: int) -> bool:
        return bool(await self._renew(keys=[scope_prefix(scope) + "l:" + key], args=[token, lease_ms]))

    async def purge(
        self, *, tenant: str | None = None, model: str | None = None, scope: str | None = None,
        key: str | None = None,
    ) -> int:
        if scope is not None and key is not None:
            p = scope_prefix(scope)
            dropped = int(await self._purge_key(keys=[p + "z", p + "v", p + "s"], args=[p, key]))
            await self._tell(Purged(scope=scope, key=key))
            return dropped
        indexes = [f"{PREFIX}t:{tenant}"] if tenant is not None else []
        indexes += [f"{PREFIX}m:{model}"] if model is not None else []
        if not indexes:
            raise ValueError("purge needs a tenant, a model, or a scope and key")
        # Each index on its own slot: intersected here, not by SINTER (one slot only on a Cluster).
        members = [{_text(m) for m in await self.client.smembers(i)} for i in indexes]
        scopes = sorted(set.intersection(*members))
        dropped = 0
        for s in scopes:
            p = scope_prefix(s)
            dropped += int(await self.client.zcard(p + "z"))
            names = [name async for name in self.client.scan_iter(match=_escape(p) + "*", count=1000)]
            if names:
                await self.client.unlink(*names)
            for index in (f"{PREFIX}t:", f"{PREFIX}m:"):
                await self._srem_everywhere(index, s)
        await self._tell(Purged(tenant=tenant, model=model))
        return dropped

    def on_purge(self, tell: Callable[[Purged], None]) -> None:
        self._purge_subscribers.append(tell)

    async def _tell(self, purged: Purged) -> None:
        """Every gate's listener hears it (one channel of the sharded ones: each listener
        subscribes to all of them), this process's included."""
        if self.cluster:
            await self.client.spublish(f"{NOTICES}:{{0}}", purged.notice())
        else:
            await self.client.publish(NOTICES, purged.notice())

    def _heard(self, text: str, wake: Callable[[str], None]) -> None:
        purged = Purged.from_notice(text) if text.startswith("purge\t") else None
        if purged is None:
            wake(text)
            return
        for tell in self._purge_subscribers:
            tell(purged)

    def _resubscribed(self) -> None:
        """Notices sent while no subscription was up are lost: a purge among them too."""
        for tell in self._purge_subscribers:
            tell(Purged())

    async def _srem_everywhere(self, index_prefix: str, scope: str) -> None:
        async for name in self.client.scan_iter(match=_escape(index_prefix) + "*", count=1000):
            await self.client.srem(name, scope)

    async def aclose(self) -> None:
        await self.client.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _escape(pattern: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\{}" else ch for ch in pattern)
