"""Every metric the gate exports, prefix `gate_`, in one registry per process."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Self

import prometheus_client
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase


class _Children(MetricWrapperBase):
    """`labels(...)` with a dictionary in front: a request finds its labelled child without
    prometheus-client's checks and lock (the children are never removed)."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Self:
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)
        memo: dict[tuple[Any, ...], Self] | None = self.__dict__.get("_memo")
        if memo is None:
            memo = self.__dict__["_memo"] = {}
        child = memo.get(labelvalues)
        if child is None:
            child = memo[labelvalues] = super().labels(*labelvalues)
        return child


class Counter(_Children, prometheus_client.Counter):
    pass


class Gauge(_Children, prometheus_client.Gauge):
    pass


class _Bins:
    """One labelled series of a `Histogram`: its bucket counts and sum, under a plain lock."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, amount: float) -> None:
        with self._lock:
            self._counts[bisect_left(self._bounds, amount)] += 1
            self._sum += amount

    def read(self) -> tuple[list[tuple[str, float]], float]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, n in zip((*self._bounds, float("inf")), counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        return buckets, total


class Histogram:
    """A Prometheus histogram whose `observe` costs a bisect and two additions: the gate
    observes about a dozen per request, and prometheus-client's own took 1.4-1.9 µs each
    (its layered checks and two locks), a tenth of a cache hit's Python. Scrapes show the same
    `_bucket`, `_count` and `_sum` series."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = prometheus_client.Histogram.DEFAULT_BUCKETS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        self._series: dict[tuple[Any, ...], _Bins] = {}  # as callers pass the label values
        self._named: dict[tuple[str, ...], _Bins] = {}  # as scrapes show them
        self._lock = threading.Lock()
        if not self._labelnames:
            self._series[()] = self._named[()] = _Bins(self._bounds)
        if registry is not None:
            registry.register(self)

    def labels(self, *values: Any) -> _Bins:
        series = self._series.get(values)
        return series if series is not None else self._add(values)

    def _add(self, values: tuple[Any, ...]) -> _Bins:
        key = tuple(str(v) for v in values)
        if len(key) != len(self._labelnames):
            raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {key}")
        with self._lock:
            series = self._named.setdefault(key, _Bins(self._bounds))
            self._series[values] = series
        return series

    def observe(self, amount: float) -> None:
        self._series[()].observe(amount)

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)]

    def collect(self) -> list[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for key, series in list(self._named.items()):
            buckets, total = series.read()
            family.add_metric(list(key), buckets, total)
        return [family]


BREAKER_STATES = ("closed", "half_open", "open")  # as gate_breaker_state encodes them: 0, 1, 2


class _PoolState:
    def __init__(self, number: Gauge, status: Gauge, pool: str) -> None:
        self._number, self._status, self._pool = number, status, pool

    def set(self, value: float) -> None:
        self._number.labels(self._pool).set(value)
        for i, state in enumerate(BREAKER_STATES):
            self._status.labels(self._pool, state).set(1.0 if i == int(value) else 0.0)


class BreakerStateGauges:
    """`gate_breaker_state` (0/1/2, kept for existing dashboards) and `gate_breaker_status`, one
    series per state with the value 1 for the state a pool is in: `{state="open"} == 1`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.number = Gauge(
            "gate_breaker_state",
            "Latency breaker state per pool as this process routes: 0 closed, 1 half-open, 2 open.",
            ["pool"],
            registry=registry,
        )
        self.status = Gauge(
            "gate_breaker_status",
            "1 for the latency breaker state each pool is in as this process routes, else 0.",
            ["pool", "state"],
            registry=registry,
        )

    def labels(self, pool: str) -> _PoolState:
        return _PoolState(self.number, self.status, pool)


FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gate_requests",
            "Requests by path, decision and status the client got.",
            ["path", "decision", "status"],
            registry=r,
        )
        self.stage_seconds = Histogram(
            "gate_stage_seconds",
            "Time spent in each stage hook.",
            ["stage", "hook"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.added_latency = Histogram(
            "gate_added_latency_seconds",
            "The gate's own processing time per request, summed over its ext_proc messages.",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.own_latency = Histogram(
            "gate_own_latency_seconds",
            "The gate's own processing time per request, without admission queue and coalescing waits.",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.stage_errors = Counter(
            "gate_stage_errors",
            "Stage hooks that raised: a fail-closed stage answered 500, any other was skipped.",
            ["stage", "hook"],
            registry=r,
        )
        self.config_reloads = Counter(
            "gate_config_reloads",
            "Config reloads (SIGHUP, a watched file): done, refused (an invalid file), or failed "
            "(its services could not be built).",
            ["result"], registry=r,
        )
        self.streams_active = Gauge("gate_streams_active", "Open ext_proc streams.", registry=r)
        self.stream_errors = Counter(
            "gate_stream_errors",
            "ext_proc streams that ended with an error.",
            ["kind"],
            registry=r,
        )

        self.store_errors = Counter(
            "gate_store_errors",
            "Store calls that failed or timed out (the request went on).",
            ["op", "error"],
            registry=r,
        )
        self.store_up = Gauge(
            "gate_store_up", "1 while the shared store answers, 0 while it is down.", registry=r
        )
        self.store_skipped = Counter(
            "gate_store_skipped",
            "Store calls not made because the store was down (the request went on without it).",
            ["op"],
            registry=r,
        )
        self.background_errors = Counter(
            "gate_background_errors",
            "Background tasks (lease renewals, releases, sync loops) that ended with an error.",
            ["task"],
            registry=r,
        )

        self.ratelimit_decisions = Counter(
            "gate_ratelimit_decisions",
            "Rate-limit decisions by result (allowed, limited, blocked, skipped), deciding limit, tier.",
            ["result", "limit", "tier"],
            registry=r,
        )
        self.ratelimit_blocks = Counter(
            "gate_ratelimit_blocks",
            "Callers blocked for repeating one prompt (each new block once).",
            ["tier"],
            registry=r,
        )

        self.breaker_state = BreakerStateGauges(r)
        self.breaker_oldest_wait = Gauge(
            "gate_breaker_oldest_wait_seconds",
            "Age of the oldest upstream call of this process still waiting for its first byte.",
            ["pool"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "gate_breaker_transitions",
            "Breaker transitions this process decided or adopted.",
            ["pool", "from_state", "to_state"],
            registry=r,
        )
        self.breaker_p95 = Gauge(
            "gate_breaker_p95_seconds",
            "Upstream P95 latency in the breaker window (merged over gate processes), per pool.",
            ["pool"],
            registry=r,
        )
        self.breaker_error_rate = Gauge(
            "gate_breaker_error_rate",
            "Share of upstream calls that failed (5xx, reset) in the breaker window, per pool.",
            ["pool"],
            registry=r,
        )
        self.breaker_reroutes = Counter(
            "gate_breaker_reroutes",
            "Requests sent to a fallback pool because the chosen pool's breaker was open.",
            ["pool", "fallback"],
            registry=r,
        )
        self.breaker_webhooks = Counter(
            "gate_breaker_webhooks",
            "Breaker webhook notices by result (delivered, failed, dropped).",
            ["result"],
            registry=r,
        )

        self.cache_requests = Counter(
            "gate_cache_requests",
            "Cache outcome per request: hit, coalesced, miss, check (sent upstream to be compared), bypass "
            "(rules), skipped (store failed).",
            ["result"],
            registry=r,
        )
        self.cache_hits = Counter(
            "gate_cache_hits",
            "Answers served from the cache by match kind (exact, near, semantic).",
            ["kind"],
            registry=r,
        )
        self.cache_local_hits = Counter(
            "gate_cache_local_hits",
            "Exact hits answered from the process's own copy (cache.local), without a store call.",
            registry=r,
        )
        self.cache_similarity = Histogram(
            "gate_cache_similarity",
            "Cosine similarity of semantic hits.",
            buckets=(0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 1.0),
            registry=r,
        )
        self.cache_stores = Counter(
            "gate_cache_stores",
            "Answers offered to the cache by outcome (stored, uncacheable, failed).",
            ["outcome"],
            registry=r,
        )
        self.cache_coalesce_wait = Histogram(
            "gate_cache_coalesce_wait_seconds",
            "How long followers waited for their leader, by how the wait ended (joined / join_missed: "
            "a paraphrase waiting for another prompt's flight).",
            ["outcome"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.cache_semantic_skips = Counter(
            "gate_cache_semantic_skips",
            "Requests that took the exact path only, by reason (unreadable, language_off, embed_error).",
            ["reason"],
            registry=r,
        )
        self.selfcheck_candidates = Counter(
            "gate_cache_selfcheck_candidates",
            "Semantic candidates by language, verifier-score bin and action (serve, check).",
            ["language", "bin", "action"],
            registry=r,
        )
        self.selfcheck_checks = Counter(
            "gate_cache_selfcheck_checks",
            "Checked candidates by language, bin and outcome (agreed, differed with the fresh answer).",
            ["language", "bin", "outcome"],
            registry=r,
        )
        self.selfcheck_lower = Gauge(
            "gate_cache_selfcheck_lower_bound",
            "95% Wilson lower bound of each bin's checked precision, as this process last read it.",
            ["tenant", "language", "bin"],
            registry=r,
        )
        self.selfcheck_serving = Gauge(
            "gate_cache_selfcheck_serving",
            "1 while a bin serves semantic hits (its lower bound at or above the target), 0 while it learns.",
            ["tenant", "language", "bin"],
            registry=r,
        )
        self.embed_batch_size = Histogram(
            "gate_embed_batch_size",
            "Texts per embedding batch (micro-batched across streams).",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.embed_seconds = Histogram(
            "gate_embed_seconds", "Inference time of one embedding batch.", buckets=FAST_BUCKETS, registry=r
        )
        self.embed_queue_seconds = Histogram(
            "gate_embed_queue_seconds",
            "How long a text waited for its embedding batch to start.",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.embed_shed = Counter(
            "gate_embed_shed",
            "Embeddings not computed because they could not arrive in time (queue_full, late, "
            "timeout): those requests took the exact path only.",
            ["reason"],
            registry=r,
        )

        # Admission queue (the scheduler service, or the gate's embedded queue).
        self.queue_length = Gauge(
            "gate_queue_length", "Requests waiting for a slot.", ["pool", "class"], registry=r
        )
        self.queue_wait = Histogram(
            "gate_queue_wait_seconds",
            "Time from arrival to grant in the admission queue, by granted class.",
            ["pool", "class"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.queue_grants = Counter("gate_queue_grants", "Slots granted.", ["pool", "class"], registry=r)
        self.queue_sheds = Counter(
            "gate_queue_sheds",
            "Requests refused by the queue: queue_full, deadline, evicted, timed_out.",
            ["pool", "class", "reason"],
            registry=r,
        )
        self.queue_demotions = Counter(
            "gate_queue_demotions",
            "High-class requests demoted after max wait.",
            ["pool", "class"],
            registry=r,
        )
        self.queue_lease_expiries = Counter(
            "gate_queue_lease_expiries",
            "Grants released by lease expiry (a gate died).",
            ["pool"],
            registry=r,
        )
        self.queue_in_flight = Gauge(
            "gate_queue_in_flight", "Slots granted, not released.", ["pool"], registry=r
        )
        self.pool_capacity = Gauge(
            "gate_pool_capacity",
            "Slots the pool may hold now, by where the figure came from.",
            ["pool", "source"],
            registry=r,
        )
        self.pool_reading_age = Gauge(
            "gate_pool_reading_age_seconds", "Age of the capacity reading in use.", ["pool"], registry=r
        )
        self.pool_memory_used = Gauge(
            "gate_pool_memory_used_ratio",
            "GPU memory or KV-cache use of the pool, 0..1.",
            ["pool"],
            registry=r,
        )
        self.admission = Counter(
            "gate_admission",
            "Gate-side admission outcomes: granted, shed, fail_open, budget.",
            ["pool", "outcome"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "gate_admission_wait_seconds",
            "Queue wait as the gate saw it (x-gate-queue-ms), by requested class.",
            ["class"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.scheduler_errors = Counter(
            "gate_scheduler_errors",
            "Calls to a remote scheduler that failed.",
            ["pool", "op", "code"],
            registry=r,
        )
        self.token_budget = Counter(
            "gate_token_budget",
            "Token budget decisions: allowed, limited, skipped or unavailable (store down).",
            ["result"], registry=r,
        )
        # Model versions (extproc/versions/): each version is a pool, so its breaker state is
        # gate_breaker_state{pool=...} of that pool.
        self.version_requests = Counter(
            "gate_version_requests", "Requests routed to each version of a model.",
            ["model", "version"], registry=r,
        )
        self.version_latency = Histogram(
            "gate_version_latency_seconds",
            "Upstream time of each version's answered calls (the whole response).",
            ["model", "version"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.version_errors = Counter(
            "gate_version_errors", "Upstream 5xx, or no answer, per version.",
            ["model", "version"], registry=r,
        )
        self.version_share = Gauge(
            "gate_version_share", "Share of a model's callers each version gets, as this process routes.",
            ["model", "version"], registry=r,
        )
        self.rollout_changes = Counter(
            "gate_rollout_changes",
            "Rollout state changes this process made or adopted: step, done, rolled_back, manual.",
            ["model", "phase", "origin"],
            registry=r,
        )
        self.config_source_updates = Counter(
            "gate_config_source_updates", "Changes from a watched config source: applied or refused.",
            ["source", "result"], registry=r,
        )

        self.sanitized_chars = Counter(
            "gate_sanitized_chars",
            "Hidden characters found in prompt text, by kind (removed, or the request refused).",
            ["kind"],
            registry=r,
        )
        self.sanitized_requests = Counter(
            "gate_sanitized_requests",
            "Requests whose prompt held hidden characters: stripped, or rejected.",
            ["action"],
            registry=r,
        )
        self.guardrail_redactions = Counter(
            "gate_guardrail_redactions",
            "Personal data redacted from answers, by kind.",
            ["kind"],
            registry=r,
        )
        self.guardrail_answers = Counter(
            "gate_guardrail_answers",
            "Answers the output guardrail screened: by how they came (upstream, replay) and outcome.",
            ["source", "outcome"],
            registry=r,
        )

        self.screen_verdicts = Counter(
            "gate_screen_verdicts",
            "Injection screen verdicts by mode (monitor, block) and verdict (pass, flagged, skipped, "
            "unavailable, unreadable).",
            ["mode", "verdict"],
            registry=r,
        )
        self.screen_scores = Counter(
            "gate_screen_scores",
            "Texts the injection screen scored, by where the score came from: this process's memo, "
            "the store (another process screened the text), or a new embedding.",
            ["source"],
            registry=r,
        )
        self.screen_masked = Counter(
            "gate_screen_masked",
            "Texts the injection screen also scored unmasked: look-alike, fullwidth or spread-out "
            "letters, leetspeak, base64, hex, ROT13, backwards (a second embedding each).",
            registry=r,
        )
        self.screen_pieces = Counter(
            "gate_screen_pieces",
            "Pieces of long texts the injection screen also scored (an embedding each).",
            registry=r,
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
