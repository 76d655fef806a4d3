"""Where self-calibration keeps its evidence: check outcomes per (tenant, language, score bin).

Two implementations with one behaviour (one table of tests runs against both): `MemoryBins`
(one process, the embedded default) and `RedisBins` (every process and replica sees the same
counts, so a bin that stops serving stops everywhere). Recording is idempotent by the check's
token: a retried call never counts one outcome twice.

Redis keys (prefix `gate:sc:` by default), one hash per tenant and language, its own hash tag:
  b:{<tenant>\\t<lang>}            field `<bin>:n` checks, `<bin>:ok` those that agreed
  b:{<tenant>\\t<lang>}:r:<token>  a recorded check (kept a day)
  index                           set of `<tenant>\\t<lang>`, for `llm-gate dedup status`
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from ..dedup.selfcheck import Counts
from ..redis_client import Client, is_cluster

TOKEN_TTL_MS = 86_400_000


@dataclass(frozen=True)
class Row:
    tenant: str
    language: str
    bin: str
    counts: Counts


class BinStore(Protocol):
    async def counts(self, tenant: str, language: str, bin: str) -> Counts: ...

    async def record(self, tenant: str, language: str, bin: str, agreed: bool, token: str) -> Counts:
        """Count one check's outcome (once per token); the bin's counts after it."""

    async def rows(self) -> list[Row]:
        """Every bin that has seen a check, by tenant, language and bin."""


class MemoryBins:
    def __init__(self, remember: int = 10_000) -> None:
        self.bins: dict[tuple[str, str, str], Counts] = {}
        self.tokens: OrderedDict[str, None] = OrderedDict()  # the last `remember` recorded checks
        self.remember = remember

    async def counts(self, tenant: str, language: str, bin: str) -> Counts:
        return self.bins.get((tenant, language, bin), Counts())

    async def record(self, tenant: str, language: str, bin: str, agreed: bool, token: str) -> Counts:
        key = (tenant, language, bin)
        c = self.bins.get(key, Counts())
        if token not in self.tokens:
            self.tokens[token] = None
            if len(self.tokens) > self.remember:
                self.tokens.popitem(last=False)
            c = Counts(c.checks + 1, c.agreed + int(agreed))
            self.bins[key] = c
        return c

    async def rows(self) -> list[Row]:
        return [Row(t, lang, b, c) for (t, lang, b), c in sorted(self.bins.items())]


RECORD = """
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  redis.call('HINCRBY', KEYS[1], ARGV[1] .. ':n', 1)
  if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], ARGV[1] .. ':ok', 1) end
end
local n, ok = redis.call('HGET', KEYS[1], ARGV[1] .. ':n'), redis.call('HGET', KEYS[1], ARGV[1] .. ':ok')
return {n or '0', ok or '0'}
"""


class RedisBins:
    def __init__(self, client: Client, prefix: str = "gate:sc:") -> None:
        self.client = client
        self.prefix = prefix
        self._record = client.register_script(RECORD)

    def _hash(self, tenant: str, language: str) -> str:
        return f"{self.prefix}b:{{{tenant}\t{language}}}"

    async def counts(self, tenant: str, language: str, bin: str) -> Counts:
        n, ok = await self.client.hmget(self._hash(tenant, language), [f"{bin}:n", f"{bin}:ok"])
        return Counts(int(n or 0), int(ok or 0))

    async def record(self, tenant: str, language: str, bin: str, agreed: bool, token: str) -> Counts:
        h = self._hash(tenant, language)
        keys = [h, f"{h}:r:{token}"]
        args: list[str | int] = [bin, int(agreed), TOKEN_TTL_MS]
        pipe: Any
        if is_cluster(self.client):  # the index lives on another slot: its own command
            n, ok = await self._record(keys=keys, args=args)
            await self.client.sadd(f"{self.prefix}index", f"{tenant}\t{language}")
            return Counts(int(n), int(ok))
        async with self.client.pipeline(transaction=False) as pipe:
            await self._record(keys=keys, args=args, client=pipe)
            pipe.sadd(f"{self.prefix}index", f"{tenant}\t{language}")
            result: list[Any] = await pipe.execute()
        n, ok = result[0]
        return Counts(int(n), int(ok))

    async def rows(self) -> list[Row]:
        out: list[Row] = []
        members: set[Any] = await self.client.smembers(f"{self.prefix}index")
        for member in sorted(_text(m) for m in members):
            tenant, _, language = member.partition("\t")
            fields: dict[Any, Any] = await self.client.hgetall(self._hash(tenant, language))
            counted = {_text(k): int(v) for k, v in fields.items()}
            for name in sorted({k.rsplit(":", 1)[0] for k in counted}):
                out.append(Row(tenant, language, name,
                               Counts(counted.get(f"{name}:n", 0), counted.get(f"{name}:ok", 0))))
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
