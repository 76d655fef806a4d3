"""The `admission` section of the config: queue policy, capacity sources, token budgets.

Kept beside the scheduler so `config.py` only names the section; the same YAML file
configures the gate and `llm-gate scheduler`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .queue import CLASSES, Policy

DEFAULT_URGENCY_WORDS = ["紧急", "立刻", "马上", "urgent", "asap", "immediately"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PromptBand(_Strict):
    """Prompts of up to `max_tokens` tokens (None: any length) take about `vram_gb` each."""

    max_tokens: int | None = Field(default=None, gt=0)
    vram_gb: float = Field(gt=0)


class Capacity(_Strict):
    # auto: nvml when nvml_devices are listed, vllm when metrics_urls or metrics_dns are,
    # static otherwise.
    source: Literal["auto", "nvml", "vllm", "static"] = "auto"
    metrics_urls: list[str] = Field(default_factory=list)  # each pool endpoint's /metrics
    # HOST:PORT of a headless Service in front of the pool's pods: every address it resolves
    # to is read (http://ADDRESS:PORT/metrics) at each refresh, so pods that come and go are
    # counted as they are.
    metrics_dns: str | None = None
    nvml_devices: list[int] = Field(default_factory=list)
    # Memory in use on those GPUs with no request running (weights, runtime): not KV cache.
    nvml_baseline_gb: float = Field(default=0.0, ge=0)
    # Size of one endpoint's KV-cache pool, to express avg_prompt_vram as a share of it.
    kv_cache_gb: float = Field(default=40.0, gt=0)
    static_limit: int = Field(default=16, ge=1)
    refresh_ms: float = Field(default=250.0, gt=0)
    stale_after_ms: float = Field(default=2000.0, gt=0)
    timeout_ms: float = Field(default=200.0, gt=0)
    vram_fraction: float = Field(default=0.7, gt=0, le=1)
    max_batch: int = Field(default=64, ge=1)
    prompt_vram_gb: list[PromptBand] = Field(
        default_factory=lambda: [
            PromptBand(max_tokens=512, vram_gb=1.2),
            PromptBand(max_tokens=2048, vram_gb=2.8),
            PromptBand(vram_gb=4.5),
        ]
    )
    pressure_above: float = Field(default=0.85, gt=0, le=1)
    # vLLM source: the limit grows by at most this much per reading while vLLM queues nothing.
    ramp: int = Field(default=2, ge=1)
    # ...and not within this long of a reading in which vLLM queued requests.
    probe_hold_ms: float = Field(default=2000.0, ge=0)


class PoolAdmission(_Strict):
    # host:port of this pool's `llm-gate scheduler`; None: the gate queues in-process.
    scheduler: str | None = None
    capacity: Capacity = Capacity()
    # For a pool whose vLLM runs `--scheduling-policy priority`: the gate sends each request's
    # `priority` (vip 0, premium 1, standard 2; a client's own is replaced) and grants vip up
    # to this many slots over the limit, so vLLM preempts running lower-class work to start it
    # at once (the preempted request waits and recomputes). 0: no priorities are sent (a
    # first-come-first-served vLLM rejects them).
    preempt_slots: int = Field(default=0, ge=0)


# A pool with no section of its own (one shared instance: building a model costs ~0.1 ms).
DEFAULT_POOL = PoolAdmission()


class SchedulerTLS(_Strict):
    """TLS between the gates and remote schedulers; the same file configures both sides."""

    cert_file: Path  # the scheduler's PEM certificate chain
    key_file: Path  # ... and its key
    # The scheduler requires gates to present a certificate this CA signed (None: any client).
    client_ca_file: Path | None = None
    ca_file: Path | None = None  # gates verify the scheduler against this CA (None: system roots)
    client_cert_file: Path | None = None  # what gates present (with client_ca_file set)
    client_key_file: Path | None = None


class TokenBudget(_Strict):
    # Tokens per minute by tenant; "*" applies to tenants not listed; none: unlimited.
    tokens_per_minute: dict[str, int] = Field(default_factory=dict)
    # Give back what the response's usage shows was not used.
    reconcile: bool = True
    # Ask for usage on streams that did not (stream_options.include_usage), so they can be
    # reconciled too. Off by default: older vLLM rejects the option, and the client then
    # also gets the final usage chunk (with empty choices) it did not ask for.
    inject_include_usage: bool = False
    # While the store cannot be reached, budgets are skipped, except on these path prefixes and
    # for these tiers, which are answered 503 (retry-after: 1).
    fail_closed_paths: list[str] = Field(default_factory=list)
    fail_closed_tiers: list[str] = Field(default_factory=list)


class Admission(_Strict):
    enabled: bool = True
    pools: dict[str, PoolAdmission] = Field(default_factory=dict)
    batch_window_ms: dict[str, float] = Field(
        default_factory=lambda: {"vip": 2.0, "premium": 10.0, "standard": 50.0}
    )
    max_wait_ms: float = Field(default=300.0, gt=0)
    aging_step_ms: float = Field(default=5000.0, gt=0)
    max_queued: int = Field(default=1024, ge=1)
    max_queued_tokens: int = Field(default=4_000_000, ge=1)
    # How long a request of each class may wait for a slot; must stay under Envoy's message_timeout.
    deadline_ms: dict[str, float] = Field(
        default_factory=lambda: {"vip": 10_000.0, "premium": 10_000.0, "standard": 10_000.0}
    )
    lease_ms: float = Field(default=120_000.0, gt=0)
    pressure_hold_ms: float = Field(default=200.0, ge=0)
    urgency_words: list[str] = Field(default_factory=lambda: list(DEFAULT_URGENCY_WORDS))
    # Output tokens assumed for a request that does not set max_tokens.
    default_max_tokens: int = Field(default=256, ge=1)
    # Connecting to / answering from a remote scheduler (besides the queue wait itself).
    scheduler_timeout_ms: float = Field(default=500.0, gt=0)
    token_budget: TokenBudget = TokenBudget()
    # TLS on the schedulers' gRPC ports and the gates' connections to them (None: plaintext).
    scheduler_tls: SchedulerTLS | None = None
    # Slots kept free for vip while vip traffic flows: its measured concurrency (arrivals x
    # service time) times reserve_factor, at most reserve_max_share of a pool (0: no reserve).
    # The other tiers lose only the reserved slots vip leaves idle, and nothing without vip traffic.
    # A quarter at most: on a 4-slot pool at 2x overload (load.bench_admission) half the pool cost
    # the lower tiers ~20 % of the pool's answers for no better vip p99; a quarter cost ~9 %.
    reserve_factor: float = Field(default=1.5, ge=0)
    reserve_max_share: float = Field(default=0.25, ge=0, lt=1)
    # How often waiting requests' ETAs are checked: one that can no longer make its deadline
    # is shed then (503 with eta_ms), not when the deadline passes.
    shed_check_ms: float = Field(default=50.0, gt=0)

    def pool(self, name: str) -> PoolAdmission:
        return self.pools.get(name) or DEFAULT_POOL

    def policy(self, pool: str) -> Policy:
        return Policy(
            batch_window_s={c: self.batch_window_ms.get(c, 0.0) / 1000 for c in CLASSES},
            max_wait_s=self.max_wait_ms / 1000,
            aging_step_s=self.aging_step_ms / 1000,
            max_queued=self.max_queued,
            max_queued_tokens=self.max_queued_tokens,
            default_deadline_s=self.deadline_ms.get("standard", 10_000.0) / 1000,
            lease_s=self.lease_ms / 1000,
            pressure_hold_s=self.pressure_hold_ms / 1000,
            reserve_factor=self.reserve_factor,
            reserve_max_share=self.reserve_max_share,
            recheck_s=self.shed_check_ms / 1000,
            preempt_slots=self.pool(pool).preempt_slots,
        )

    def deadline_s(self, cls: str) -> float:
        return self.deadline_ms.get(cls, self.deadline_ms.get("standard", 10_000.0)) / 1000
