"""A process's own copy of the exact entries it served or stored last: a repeated question is
answered without a store round trip (its identity, rate-limit and screen checks still run:
they are stages before the cache).

Bounded by bytes (the least recently used go first) and by time: an entry stays here until
its own TTL ends or `ttl_s` passes, whichever comes first. A purge reaches every process: the
store tells its subscribers (`Store.on_purge`; on Redis, a notice every gate hears), and a
process whose subscription broke drops everything it holds when it subscribes again, since a
purge may have gone by meanwhile.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .entry import Entry

# One entry may take at most this share of the bytes: a few huge answers must not push out
# the many small ones that repeat.
MAX_ENTRY_SHARE = 8


@dataclass(frozen=True)
class Purged:
    """What a purge dropped: by tenant and/or model, or one entry by scope and key; nothing
    named means everything."""

    tenant: str | None = None
    model: str | None = None
    scope: str | None = None
    key: str | None = None

    def covers(self, slot: str, entry: Entry) -> bool:
        if self.scope is not None and self.key is not None:
            return slot == f"{self.scope}.{self.key}"
        return (self.tenant is None or entry.tenant == self.tenant) and (
            self.model is None or entry.model == self.model
        )

    def notice(self) -> str:
        """Its form on the store's notice channel (slots are hex: no tab in them)."""
        return "\t".join(["purge", *(v if v is not None else "" for v in self._fields())])

    @classmethod
    def from_notice(cls, text: str) -> Purged | None:
        parts = text.split("\t")
        if len(parts) != 5 or parts[0] != "purge":
            return None
        tenant, model, scope, key = (p or None for p in parts[1:])
        return cls(tenant, model, scope, key)

    def _fields(self) -> tuple[str | None, ...]:
        return (self.tenant, self.model, self.scope, self.key)


@dataclass
class _Hot:
    entry: Entry
    size: int
    until: float  # on the monotonic clock


class HotEntries:
    def __init__(
        self, max_bytes: int, ttl_s: float, *, clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.wall = wall
        self.bytes = 0
        self._items: OrderedDict[str, _Hot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, slot: str) -> Entry | None:
        """The entry kept for `slot` ("<scope>.<key>"), while it lives."""
        item = self._items.get(slot)
        if item is None:
            return None
        if item.until <= self.clock():
            self._drop(slot)
            return None
        self._items.move_to_end(slot)
        return item.entry

    def put(self, slot: str, entry: Entry, size: int, ttl_s: float) -> None:
        """Keep `entry` (`size` bytes as stored, stored with `ttl_s`) for what is left of its life."""
        life = min(self.ttl_s, entry.stored_at + ttl_s - self.wall())
        if life <= 0 or size * MAX_ENTRY_SHARE > self.max_bytes:
            return
        self._drop(slot)
        self._items[slot] = _Hot(entry, size, self.clock() + life)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._items)))

    def purge(self, purged: Purged) -> None:
        for slot in [s for s, item in self._items.items() if purged.covers(s, item.entry)]:
            self._drop(slot)

    def _drop(self, slot: str) -> None:
        item = self._items.pop(slot, None)
        if item is not None:
            self.bytes -= item.size
