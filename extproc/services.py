"""What lives as long as the process's config: clients, stores, breakers, queues, matchers.

Built once per config (at start, and again on reload), started before the gate says
SERVING, closed when the pipeline built on them retires. Stages act per request and keep
no state of their own; they are built from their config section plus these services.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .breaker.adaptive import AdaptiveLimit
from .breaker.monitor import Breakers
from .breaker.webhook import Notifier
from .cache.hot import HotEntries
from .cache.keeper import PUT_TASK
from .cache.lease import Leases
from .cache.selfcheck import SelfCheck, make_bins
from .cache.setup import Matchers, answer_store, load_matchers
from .cache.store import Store as AnswerStore
from .config import Config
from .metrics import Metrics
from .ratelimit.store import LimitStore
from .ratelimit.store import MemoryStore as MemoryLimits
from .ratelimit.store import RedisStore as RedisLimits
from .redis_client import Client
from .redis_conn import StoreGuard, connect
from .safety.pieces import PIECES
from .safety.screener import Screener
from .safety.unmask import READING
from .safety.verdicts import SharedVerdicts
from .scheduler.budget import BudgetStore, MemoryBudgets, RedisBudgets
from .scheduler.pools import Pools
from .tasks import Tasks
from .tokens import TokenCounter
from .tracing import Tracing
from .versions.choose import Share
from .versions.monitor import VersionMonitor
from .versions.traffic import Traffic

log = logging.getLogger("llm_gate.services")
# At a close, the answers still being stored get this long (each store call has its own, shorter
# budget) before the background tasks are cancelled.
STORE_SETTLE_S = 1.0


@dataclass
class Services:
    metrics: Metrics
    tasks: Tasks
    store: StoreGuard  # the request path's Redis client (None inside: the embedded store)
    tokens: TokenCounter
    limits: LimitStore
    budgets: BudgetStore
    answers: AnswerStore
    leases: Leases
    hot: HotEntries | None  # cache.local; None when off
    matchers: Matchers
    selfcheck: SelfCheck | None  # cache.semantic.self_check; None when off
    breakers: Breakers
    breaker_client: Client | None  # the breaker's own client, closed with the rest
    pools: Pools
    tracing: Tracing
    traffic: Traffic  # the process's traffic overrides: outlives this config
    versions: VersionMonitor
    screener: Screener | None = None  # screen: None when every tenant's mode is off

    @classmethod
    def build(cls, config: Config, metrics: Metrics, traffic: Traffic | None = None) -> Services:
        """Everything a pipeline needs; may load models (call it off the event loop on reload).

        `traffic`: the process's overrides (etcd, shared rollout state), kept across reloads.
        """
        tasks = Tasks(metrics)
        redis = connect(config.store, request_path=True)
        store = StoreGuard(redis, config.store, metrics, tasks, local=redis is None)
        c = config.cache
        answers = answer_store(redis, config.store.topology if c.enabled else None)
        hot = HotEntries(int(c.local.max_mb * 2**20), c.local.ttl_s) if c.enabled and c.local.max_mb else None
        if hot is not None:
            answers.on_purge(hot.purge)
        # The breaker's sync loop is off the request path: its own client, a looser time box.
        breaker_store = config.store.model_copy(update={"op_timeout_ms": config.breaker.sync_timeout_ms})
        breaker_client = connect(breaker_store)
        breakers = Breakers(config.breaker, config.routing.pools, metrics, breaker_client, tasks=tasks)
        pools = Pools(config.admission, metrics, config.server.workers, names=list(config.routing.pools))
        # The seed's adaptive limit: a pool slowing down under load gets fewer slots.
        breakers.subscribe(AdaptiveLimit(config.breaker, pools.set_capacity_factor))
        traffic = traffic if traffic is not None else Traffic()
        if traffic.published is None:
            traffic.published = _share_gauges(metrics)
        sync_store = config.store.model_copy(update={"op_timeout_ms": config.routing.version_sync.timeout_ms})
        notifier = Notifier(config.breaker.webhook, metrics) if config.breaker.webhook else None
        versions = VersionMonitor(
            config.routing, traffic, metrics, connect(sync_store), notifier, tasks=tasks
        )
        prefix = config.ratelimit.key_prefix
        cache_budget_s = c.op_timeout_ms / 1000 if c.op_timeout_ms is not None else None
        sc = c.semantic.self_check
        selfcheck = (
            SelfCheck(sc, make_bins(redis, sc.key_prefix), store, metrics, tasks, budget_s=cache_budget_s)
            if c.enabled and sc.enabled else None
        )
        return cls(
            metrics=metrics,
            tasks=tasks,
            store=store,
            tokens=TokenCounter(config.validation.tokenizer),
            limits=MemoryLimits(prefix) if redis is None else RedisLimits(redis, prefix),
            budgets=MemoryBudgets() if redis is None else RedisBudgets(redis),
            answers=answers,
            leases=Leases(answers, store, c.coalesce, metrics, tasks, budget_s=cache_budget_s),
            hot=hot,
            matchers=(
                load_matchers(c.semantic, metrics, config.server.workers) if c.enabled else Matchers(None, [])
            ),
            selfcheck=selfcheck,
            breakers=breakers,
            breaker_client=breaker_client,
            pools=pools,
            tracing=Tracing.create(config.server.tracing),
            traffic=traffic,
            versions=versions,
            screener=_screener(config, redis, store, tasks, metrics),
        )

    async def start(self) -> None:
        """Start every background loop in the running event loop, before any request: no
        service is started from a request's path."""
        if self.breakers.config.enabled:
            self.breakers.start()
        self.leases.start()
        await self.pools.start()
        self.versions.start()

    async def aclose(self) -> None:
        """Stop every background task and close every client, whatever fails on the way."""
        for name, close in (
            ("answers being stored", lambda: self.tasks.wait(STORE_SETTLE_S, PUT_TASK)),
            ("tasks", self.tasks.aclose),
            ("breakers", self.breakers.close),
            ("breaker client", self._close_breaker_client),
            ("versions", self.versions.close),
            ("pools", self.pools.aclose),
            ("matchers", self.matchers.aclose),
            ("screener", self.screener.aclose if self.screener is not None else _async(lambda: None)),
            ("store", self.store.aclose),
            ("tracing", _async(self.tracing.aclose)),
            ("tokens", _async(self.tokens.close)),
        ):
            try:
                await close()
            except Exception:
                log.exception("closing %s failed", name)


    async def _close_breaker_client(self) -> None:
        if self.breaker_client is not None:
            await self.breaker_client.aclose()


def _async(close: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        close()

    return run


def _share_gauges(metrics: Metrics) -> Callable[[str, tuple[Share, ...]], None]:
    def publish(model: str, table: tuple[Share, ...]) -> None:
        for version in table:
            metrics.version_share.labels(model, version.name).set(version.share)

    return publish


def _screener(
    config: Config, redis: Client | None, store: StoreGuard, tasks: Tasks, metrics: Metrics
) -> Screener | None:
    """The screen's service when any tenant screens; its verdicts shared through the store
    when there is one."""
    c = config.screen
    if not c.enabled:
        return None
    screener = Screener.build(c)
    screener.on_score = lambda source: metrics.screen_scores.labels(source).inc()
    screener.on_masked = metrics.screen_masked.inc
    screener.on_pieces = metrics.screen_pieces.inc
    if redis is not None and c.shared_ttl_s > 0:
        # A new head or a new way of reading a text: new keys.
        prefix = f"{c.key_prefix}{screener.head.fingerprint()}{READING}{PIECES}m{c.middle_pieces}:"
        screener.shared = SharedVerdicts(redis, store, tasks, prefix, int(c.shared_ttl_s * 1000))
    return screener
