"""In-flight coalescing: identical requests wait for one answer instead of each calling the model.

A lease in the store names the one request (the leader) computing the answer for a key;
it lives `lease_s` and the leader renews it every third of that, so a leader whose process
died is replaced within `lease_s`. Requests in the same process never poll the store for
each other: the first one speaks to the store for all of them (`_Local`), and the others
wait on it. Followers of a leader in another process re-check the store with a growing
delay, woken at once by the store's notice when that leader's answer lands.

When a leader gives up without an answer, exactly one waiter takes its place (the store's
`SET NX`; locally, the first waiter to run). A paraphrase that joins another key's flight
(`join`) only waits: it never takes that lead, since its own prompt is not that key's.
A lookup that ran in the store but whose reply came too late may have taken a lease nobody
knows of: it is handed back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ..config import CacheCoalesce
from ..exchange import new_id
from ..metrics import Metrics
from ..redis_conn import StoreGuard
from ..tasks import Tasks
from .flight import Wakeups
from .store import Store

T = TypeVar("T")
ClaimRole = Literal["hit", "leader", "upstream", "unavailable"]
# Handing back a lease nobody learned of: off the request path, so it may take longer.
RELEASE_BUDGET_S = 1.0


@dataclass(frozen=True)
class Claim:
    """What a request does next: serve `entry`, lead (compute and store), go upstream
    without leading, or skip the cache because the store is unavailable."""

    role: ClaimRole
    entry: bytes | None = None
    token: str | None = None
    coalesced: bool = False  # it waited for another request


@dataclass
class _Local:
    """This process's one voice in the store for a key; its waiters share the outcome."""

    done: asyncio.Future[bytes | None]
    scope: str
    key: str
    token: str | None = None
    # The lease's renewal: a timer until the first renewal is due (most answers come before
    # it: no task is made for them), then the task that renews it.
    keepalive: asyncio.TimerHandle | asyncio.Task[None] | None = field(default=None, repr=False)


class Leases:
    def __init__(
        self, store: Store, guard: StoreGuard, config: CacheCoalesce, metrics: Metrics, tasks: Tasks,
        clock: Callable[[], float] = time.monotonic, budget_s: float | None = None,
    ) -> None:
        self.store = store
        self.guard = guard
        self.config = config
        self.metrics = metrics
        self.tasks = tasks
        self.clock = clock
        self.budget_s = budget_s  # each store call's; None: the guard's (store.op_timeout_ms)
        self.local: dict[str, _Local] = {}
        self.wakeups = Wakeups()  # followers of leaders elsewhere, woken by the store's notices

    def start(self) -> None:
        """Listen to the store's notices, when it sends any (Redis: pub/sub)."""
        listen = getattr(self.store, "listen", None)
        if listen is not None:
            self.tasks.spawn(listen(self.wakeups.wake), "cache_notices")

    @property
    def lease_ms(self) -> int:
        return int(self.config.lease_s * 1000)

    async def claim(self, scope: str, key: str, *, lead: bool, wait_s: float) -> Claim:
        """The entry, or the lead, or a wait of at most `wait_s` for whoever leads.

        `lead` False only looks: `hit` or `upstream`.
        """
        slot = f"{scope}.{key}"
        started = self.clock()
        deadline = started + wait_s
        coalesced = False
        while lead and (here := self.local.get(slot)) is not None:
            coalesced = True
            entry = await _wait(here.done, deadline - self.clock())
            if entry is not None:
                self._observe("answered", started)
                return Claim("hit", entry, coalesced=True)
            if self.clock() >= deadline:
                self._observe("timeout", started)
                return Claim("upstream", coalesced=True)
            # The leader here ended without an answer: the first waiter to run takes over.
        if not lead:
            found = await self._run(self.store.lookup(scope, key, None, 0), None, "cache_lookup")
            if found is None:
                return Claim("unavailable")
            return Claim("hit", found.entry) if found.role == "hit" else Claim("upstream")
        local = _Local(asyncio.get_running_loop().create_future(), scope, key)
        self.local[slot] = local
        token = new_id()
        try:
            return await self._speak(slot, local, token, coalesced, deadline, started)
        except BaseException:
            # Cancelled (the client went away, Envoy reset the stream) while this request
            # spoke for the process: the waiters here take over, and a lease the store may
            # have given it is handed back. Nothing it registered outlives it.
            if local.token is None:
                self._abandon(scope, key, token)
                self._settle(slot, local, None)
                self._observe("cancelled", started)
            raise

    async def _speak(
        self, slot: str, local: _Local, token: str, coalesced: bool, deadline: float, started: float
    ) -> Claim:
        """This process's lookup for `local`'s key: a hit, the lead, or a wait for a leader."""
        lookup = self.store.lookup(local.scope, local.key, token, self.lease_ms)
        found = await self._run(lookup, None, "cache_lookup")
        if found is None:
            self._abandon(local.scope, local.key, token)
            self._settle(slot, local, None)
            return Claim("unavailable")
        if found.role == "hit":
            self._settle(slot, local, found.entry)
            return Claim("hit", found.entry, coalesced=coalesced)
        if found.role == "leader":
            self._lead(local, token)
            return Claim("leader", token=token, coalesced=coalesced)
        return await self._follow(slot, local, token, deadline, started)

    async def join(self, scope: str, key: str, wait_s: float) -> bytes | None:
        """The answer of the request leading `key` (another prompt, judged the same question),
        within `wait_s`; None when it ends without one, nobody leads it, or time runs out."""
        slot = f"{scope}.{key}"
        started = self.clock()
        deadline = started + wait_s
        here = self.local.get(slot)
        if here is not None:
            entry = await _wait(here.done, wait_s)
            self._observe("joined" if entry is not None else "join_missed", started)
            return entry
        delay = self.config.poll_ms / 1000
        while True:
            found = await self._run(self.store.lookup(scope, key, None, 0), None, "cache_lookup")
            if found is not None and found.role == "hit":
                self._observe("joined", started)
                return found.entry
            remaining = deadline - self.clock()
            if found is None or found.role == "none" or remaining <= 0:
                self._observe("join_missed", started)
                return None
            await self.wakeups.wait(slot, min(delay, remaining))
            delay = min(delay * 2, self.config.poll_max_ms / 1000)

    async def _follow(self, slot: str, local: _Local, token: str, deadline: float, started: float) -> Claim:
        """Wait for a leader in another process; take over if it gives up."""
        delay = self.config.poll_ms / 1000
        while (remaining := deadline - self.clock()) > 0:
            await self.wakeups.wait(slot, min(delay, remaining))
            found = await self._run(
                self.store.lookup(local.scope, local.key, token, self.lease_ms), None, "cache_lookup"
            )
            if found is None:
                self._abandon(local.scope, local.key, token)
                self._settle(slot, local, None)
                self._observe("store_error", started)
                return Claim("unavailable", coalesced=True)
            if found.role == "hit":
                self._settle(slot, local, found.entry)
                self._observe("answered", started)
                return Claim("hit", found.entry, coalesced=True)
            if found.role == "leader":
                self._lead(local, token)
                self._observe("promoted", started)
                return Claim("leader", token=token, coalesced=True)
            delay = min(delay * 2, self.config.poll_max_ms / 1000)
        self._settle(slot, local, None)
        self._observe("timeout", started)
        return Claim("upstream", coalesced=True)

    def _lead(self, local: _Local, token: str) -> None:
        local.token = token
        local.keepalive = asyncio.get_running_loop().call_later(
            self.config.lease_s / 3, self._renewal_due, local, token
        )

    def _renewal_due(self, local: _Local, token: str) -> None:
        if local.token == token:
            local.keepalive = self.tasks.spawn(self._keep(local, token), "cache_lease_renew")

    async def _keep(self, local: _Local, token: str) -> None:
        while local.token == token:
            held = await self._run(
                self.store.renew(local.scope, local.key, token, self.lease_ms), True, "cache_renew"
            )
            if not held:
                return  # taken over (our lease expired): the new leader's answer will do
            await asyncio.sleep(self.config.lease_s / 3)

    async def finish(self, scope: str, key: str, token: str, entry: bytes | None, *, stored: bool) -> None:
        """The leader is done: `entry` is its answer (None: there is none to share).

        `stored`: the entry is in the store, which handed the lease back with it.
        """
        slot = f"{scope}.{key}"
        here = self.local.get(slot)
        mine = here if here is not None and here.token == token else None
        if mine is not None:
            mine.token = None
            if mine.keepalive is not None:
                mine.keepalive.cancel()
        if not stored:  # hand the lease back before a waiter here tries to take it
            await self._run(self.store.release(scope, key, token), False, "cache_release")
        if mine is not None:
            self._settle(slot, mine, entry)
        self.wakeups.wake(slot)

    async def _run(self, call: Coroutine[Any, Any, T], default: T, op: str) -> T:
        return await self.guard.run(call, default, op, self.budget_s)

    def _settle(self, slot: str, local: _Local, entry: bytes | None) -> None:
        if self.local.get(slot) is local:
            del self.local[slot]
        if not local.done.done():
            local.done.set_result(entry)

    def _abandon(self, scope: str, key: str, token: str) -> None:
        """A lookup whose reply never came may still have taken the lease: hand it back."""
        release = self.store.release(scope, key, token)
        self.tasks.spawn(
            self.guard.run(release, False, "cache_release", budget_s=RELEASE_BUDGET_S), "cache_release"
        )

    def _observe(self, outcome: str, started: float) -> None:
        self.metrics.cache_coalesce_wait.labels(outcome).observe(self.clock() - started)


async def _wait(done: asyncio.Future[bytes | None], seconds: float) -> bytes | None:
    """The local leader's answer, or None when it had none or `seconds` ran out."""
    if seconds <= 0:
        return None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            return await asyncio.shield(done)
    return None
