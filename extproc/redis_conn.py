"""Redis access for the request path: one client per process, and one judge of its health.

Slow is not down. While the store is **up**, a call may take up to its budget
(`store.op_timeout_ms`, tens of ms): a reply that queued behind a busy event loop is still a
reply. One call over budget fails open for that request alone. The store is **down** only
after `down_after` failures in a row; then calls are skipped at once (fail open, counted in
`gate_store_skipped_total`) and a ping every `probe_interval_ms` brings it back up.

No call is retried on a time-out: a script that ran but whose reply was late must not run
twice. The scripts are idempotent by request token anyway, so the one retry on a dead
pooled connection (after a Redis restart or a failover) cannot change an outcome.

Which node answers is the client's business (`redis_client`): after a Sentinel promotion
or a Cluster failover the probe's ping reaches the new master, and the store is up again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from redis.asyncio import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .config import Store
from .metrics import Metrics
from .redis_client import Client, connect_topology
from .redis_client import ping as ping_store
from .redis_config import RedisTopology
from .tasks import Tasks

T = TypeVar("T")
log = logging.getLogger("llm_gate.redis")
# A Cluster between a master's death and its replica's promotion answers CLUSTERDOWN,
# TRYAGAIN or MASTERDOWN, or its client finds no node for a slot: as down as a refused call.
OUTAGE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError, ClusterDownError, TryAgainError,
          MasterDownError, RedisClusterException)
# A store that does not answer a ping within this long is down, however busy this process is.
CHECK_BUDGET_S = 1.0


def connect(config: Store, request_path: bool = False) -> Client | None:
    """The client of the configured topology; None: the in-process store."""
    topology = config.topology
    if topology is None:
        return None
    return connect_topology(topology, connect_timeout_s=max(config.op_timeout_ms / 1000, 0.05),
                            request_path=request_path)


def admin_client(url: str | None, store: Store | None) -> Client | None:
    """For the command-line tools: `url` when given, else the config's topology; None: none."""
    topology = RedisTopology(url=url) if url else store.topology if store is not None else None
    return None if topology is None else connect_topology(topology, connect_timeout_s=2.0)


class StoreGuard:
    """Every request-path store call goes through `run`; `up` is this process's view."""

    def __init__(
        self, client: Client | None, config: Store, metrics: Metrics, tasks: Tasks,
        clock: Callable[[], float] = time.monotonic, *, local: bool = False,
    ) -> None:
        self.client = client
        # Every store behind this guard is in this process (no Redis configured): its calls
        # are awaited as they are, without a time box (~7 µs of timers per call).
        self.local = local
        self.budget_s = config.op_timeout_ms / 1000
        self.down_after = config.down_after
        self.probe_s = config.probe_interval_ms / 1000
        self.metrics = metrics
        self.tasks = tasks
        self.clock = clock
        self.up = True
        self.failures = 0  # in a row
        self.down_since: float | None = None
        self._checking: asyncio.Task[None] | None = None
        self._warming: asyncio.Lock | None = None
        metrics.store_up.set(1)

    def _cold(self) -> bool:
        """A Cluster client that has not read the slot map yet (it does on its first call)."""
        return isinstance(self.client, RedisCluster) and bool(getattr(self.client, "_initialize", False))

    async def _warm(self) -> None:
        """Read a Cluster's slot map and dial its masters once, within a ping's budget rather
        than the first request's: the first calls of a process wait for it together."""
        self._warming = self._warming or asyncio.Lock()
        async with self._warming:
            if self._cold() and isinstance(self.client, RedisCluster):
                async with asyncio.timeout(CHECK_BUDGET_S):
                    await self.client.initialize()

    async def run(
        self, call: Coroutine[Any, Any, T], default: T, op: str, budget_s: float | None = None
    ) -> T:
        """`call`'s result; `default` when the store is down, fails, or the call is over budget.

        `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` can swallow a
        cancellation that races the result, and a background loop then never stops.
        """
        if self.local:  # in-process stores answer at once: nothing to time, nothing to lose
            return await call
        if not self.up:
            call.close()
            self.metrics.store_skipped.labels(op).inc()
            return default
        try:
            if self._cold():
                await self._warm()
            async with asyncio.timeout(budget_s if budget_s is not None else self.budget_s):
                result = await call
        except OUTAGE as exc:
            self._failed(op, exc, outage=True)
            return default
        except RedisError as exc:  # the store answered, with an error: not an outage
            self._failed(op, exc, outage=False)
            return default
        except Exception as exc:
            # Not the store's answer: the client library's own failure on a connection cut
            # mid-call (redis-py has raised IndexError and AttributeError there), or a bug in
            # reading the reply. The request goes on as for a failed call; the trace is kept.
            log.exception("store call %s raised %s", op, type(exc).__name__)
            self._failed(op, exc, outage=False)
            return default
        finally:
            raise_swallowed_cancel()
        self.failures = 0
        return result

    def _failed(self, op: str, exc: BaseException, *, outage: bool) -> None:
        self.metrics.store_errors.labels(op, type(exc).__name__).inc()
        log.debug("store call %s failed: %r", op, exc)
        if not outage:
            return
        self.failures += 1
        if not self.up or self.failures < self.down_after:
            return
        if isinstance(exc, TimeoutError | RedisTimeoutError):
            # Late replies may be the event loop's fault, not the store's: a ping decides.
            if self._checking is None:
                self._checking = self.tasks.spawn(self._check(), "store_check")
            return
        self._mark_down(f"{self.failures} failures in a row, the last {type(exc).__name__}")

    async def _check(self) -> None:
        try:
            if not await self.ping(CHECK_BUDGET_S):
                self._mark_down(f"{self.failures} time-outs in a row and no answer to a ping")
            else:
                self.failures = 0
        finally:
            self._checking = None

    def _mark_down(self, why: str) -> None:
        if not self.up:
            return
        self.up = False
        self.down_since = self.clock()
        self.metrics.store_up.set(0)
        log.warning("store down (%s): cache and limits are skipped until it answers again", why)
        self.tasks.spawn(self._probe(), "store_probe")

    async def _probe(self) -> None:
        while not self.up:
            await asyncio.sleep(self.probe_s)
            if await self.ping():
                self.up, self.failures = True, 0
                self.metrics.store_up.set(1)
                down_s = self.clock() - (self.down_since or self.clock())
                log.warning("store up again after %.1fs", down_s)

    async def ping(self, budget_s: float = CHECK_BUDGET_S) -> bool:
        if self.client is None:
            return True
        try:
            async with asyncio.timeout(budget_s):
                await ping_store(self.client)
        except (*OUTAGE, RedisError):
            return False
        return True

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()


def raise_swallowed_cancel() -> None:
    """redis-py 8 answers a command whose task was cancelled with None instead of raising
    CancelledError: the cancellation would be lost, and a request whose client went away would
    go on as if it had an answer. The task still counts the request: raise it here."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def timeboxed(call: Awaitable[T], default: T, timeout_s: float, metrics: Metrics, op: str) -> T:
    """Off the request path (the breaker's sync loop): `call` within `timeout_s`, else `default`."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except (RedisError, OSError, TimeoutError) as exc:
        metrics.store_errors.labels(op, type(exc).__name__).inc()
        log.debug("store call %s failed: %r", op, exc)
        return default
