"""What the cache's two jobs (finding an answer, keeping one) share: the store behind its
guard, the leases, and the process's hot copy of exact entries."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..config import Cache as CacheConfig
from ..metrics import Metrics
from ..redis_conn import StoreGuard
from ..tasks import Tasks
from .entry import Entry
from .hot import HotEntries
from .lease import Leases
from .store import Store

if TYPE_CHECKING:
    from .selfcheck import SelfCheck

T = TypeVar("T")
_DOWN: Any = object()


class StoreDownError(Exception):
    """A cache store call failed or ran over its budget: this request skips the cache."""


@dataclass
class Backing:
    config: CacheConfig
    store: Store
    guard: StoreGuard
    leases: Leases
    metrics: Metrics
    hot: HotEntries | None = None
    selfcheck: SelfCheck | None = None  # semantic candidates served only from bins that checks proved
    tasks: Tasks | None = None  # what runs beside a request, not in its way
    op_timeout_s: float | None = None  # each store call's budget; None: the guard's
    clock: Callable[[], float] = time.monotonic

    async def call(self, call: Coroutine[Any, Any, T], op: str) -> T:
        """`call`'s result, or `StoreDownError`."""
        result = await self.guard.run(call, _DOWN, f"cache_{op}", self.op_timeout_s)
        if result is _DOWN:
            raise StoreDownError(op)
        return cast(T, result)

    def ttl_s(self, entry: Entry) -> float:
        """How long `entry` is kept: a paraphrase's alias shorter than an answer."""
        c = self.config
        return min(c.alias_ttl_s, c.ttl_s) if entry.source else c.ttl_s

    def keep_hot(self, scope: str, key: str, entry: Entry, size: int) -> None:
        if self.hot is not None:
            self.hot.put(f"{scope}.{key}", entry, size, self.ttl_s(entry))
