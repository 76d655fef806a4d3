"""The gate's configuration: one YAML file, validated at start.

Every threshold has a default, so an empty file is a working embedded gate.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from .redis_config import RedisTopology, check_url
from .scheduler.settings import Admission
from .versions.settings import Sources, VersionedModel, VersionSync

Tier = Literal["vip", "premium", "standard"]
TIERS: tuple[Tier, ...] = ("vip", "premium", "standard")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Caller(Strict):
    tenant: str
    tier: Tier = "standard"
    user: str | None = None
    # `x-canary: true` from this key sends its requests to the model's canary version.
    canary: bool = False
    # Stricter checks for this key (e.g. a caller with a complaint history): the injection
    # screen uses `screen.elevated_threshold`. Only ever from the key's config, never a header.
    risk: Literal["normal", "elevated"] = "normal"


class Identity(Strict):
    # Keys in this file are read by anyone who can read the config (a ConfigMap): keep them in
    # `api_keys_file` (a mounted Secret) or the variable `api_keys_env` names, both YAML or
    # JSON of the same shape ({key: {tenant, tier, user}}). All three are merged.
    api_keys: dict[str, Caller] = Field(default_factory=dict)
    api_keys_file: Path | None = None
    api_keys_env: str | None = None
    anonymous: Caller = Caller(tenant="anonymous", tier="standard")
    unknown_keys: Literal["anonymous", "reject"] = "anonymous"
    # A request with no key at all: the anonymous caller, or a 401.
    missing_keys: Literal["anonymous", "reject"] = "anonymous"
    # Only when an upstream auth filter (ext_authz, Istio RequestAuthentication) sets them.
    trust_identity_headers: bool = False
    tenant_header: str = "x-tenant-id"
    tier_header: str = "x-tenant-tier"
    # The caller's identity headers (tenant, tier, x-priority) reach the model servers only
    # when this is on; its credentials (authorization, x-api-key) never do.
    forward_identity_headers: bool = False

    def keys(self) -> dict[str, Caller]:
        """Every configured key, read now from the file and the environment too."""
        found = dict(self.api_keys)
        sources: list[tuple[str, str]] = []
        if self.api_keys_file is not None:
            sources.append((str(self.api_keys_file), self.api_keys_file.read_text(encoding="utf-8")))
        if self.api_keys_env is not None:
            if self.api_keys_env not in os.environ:
                raise ValueError(f"environment variable {self.api_keys_env} is not set")
            sources.append((f"${self.api_keys_env}", os.environ[self.api_keys_env]))
        for where, text in sources:
            doc = yaml.safe_load(text) or {}
            if not isinstance(doc, dict):
                raise ValueError(f"{where}: expected a mapping of API key to caller")
            try:
                found.update({str(k): Caller.model_validate(v) for k, v in doc.items()})
            except ValidationError as exc:
                raise ValueError(f"{where}: {exc.errors()[0]['msg']}") from None
        return found


class RequiredHeader(Strict):
    header: str
    path_prefix: str = "/"


class Validation(Strict):
    # Match Envoy's per_connection_buffer_limit_bytes so our JSON 413 wins.
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    max_prompt_tokens: int = Field(default=16_384, gt=0)
    max_output_tokens: int = Field(default=32_768, gt=0)
    # tokenizer.json used to count prompt tokens; None: the bundled default.
    tokenizer: Path | None = None
    required_headers: list[RequiredHeader] = Field(default_factory=list)
    # Deeper bodies get a 400: every stage after validation may serialise the payload.
    max_json_depth: int = Field(default=64, ge=2, le=200)


class Pool(Strict):
    cluster: str
    # Model name the pool's servers know; requests are rewritten to it when it differs.
    served_model: str | None = None
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    fallback: str | None = None
    # The key the gate sends to this pool's servers (vLLM --api-key), from an environment
    # variable or a file, never from this file. Clients' own keys never leave the gate.
    api_key_env: str | None = None
    api_key_file: Path | None = None

    def upstream_key(self) -> str | None:
        """The pool's key, read now; a named variable or file that is missing is an error."""
        if self.api_key_env is not None:
            if not os.environ.get(self.api_key_env):
                raise ValueError(f"environment variable {self.api_key_env} is not set")
            return os.environ[self.api_key_env].strip()
        if self.api_key_file is not None:
            return self.api_key_file.read_text(encoding="utf-8").strip()
        return None


class Rule(Strict):
    pool: str
    path_prefix: str | None = None
    scene_prefix: str | None = None


class Routing(Strict):
    handled_paths: list[str] = Field(default_factory=lambda: ["/v1/chat/completions", "/v1/completions"])
    # "METHOD /path" requests passed to the default pool untouched; any other path or method
    # is answered 404 by the gate (and, with the shipped Envoy files, by Envoy before it).
    passthrough: list[str] = Field(default_factory=lambda: ["GET /v1/models", "GET /health"])
    pools: dict[str, Pool] = Field(
        default_factory=lambda: {
            "primary": Pool(cluster="primary", fallback="fallback"),
            "fallback": Pool(cluster="fallback", served_model="phi-3-mini"),
        }
    )
    models: dict[str, str] = Field(default_factory=lambda: {"phi-3-mini": "fallback", "phi-3": "fallback"})
    default_pool: str | None = "primary"
    rules: list[Rule] = Field(default_factory=list)
    scene_header: str = "x-business-scene"
    # Models served by several versions (weighted, sticky per caller); before `models`.
    versions: dict[str, VersionedModel] = Field(default_factory=dict)
    version_sync: VersionSync = VersionSync()

    @model_validator(mode="after")
    def _passthrough_shape(self) -> Routing:
        bad = [e for e in self.passthrough if len(e.split()) != 2 or not e.split()[1].startswith("/")]
        if bad:
            raise ValueError(f"passthrough entries must be 'METHOD /path'; got {bad}")
        return self

    @model_validator(mode="after")
    def _pools_exist(self) -> Routing:
        named = [("default_pool", self.default_pool)] if self.default_pool else []
        named += [(f"models.{m}", p) for m, p in self.models.items()]
        named += [(f"rules.{i}.pool", r.pool) for i, r in enumerate(self.rules)]
        named += [(f"pools.{n}.fallback", p.fallback) for n, p in self.pools.items() if p.fallback]
        named += [
            (f"versions.{m}.{v.name}", v.pool) for m, vm in self.versions.items() for v in vm.versions
        ]
        missing = [f"{where}: unknown pool {pool!r}" for where, pool in named if pool not in self.pools]
        if missing:
            raise ValueError("; ".join(missing))
        return self


class ServerTLS(Strict):
    cert_file: Path  # PEM certificate chain the gRPC port presents
    key_file: Path  # its PEM private key
    # PEM CA bundle: when set, clients (Envoy, the gate) must present a certificate it signed.
    client_ca_file: Path | None = None


class Server(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    metrics_port: int | None = Field(default=9464, ge=0, le=65535)
    # Admin HTTP endpoint (cache purge, blocks); worker i on admin_port + i. None: off.
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    grace_seconds: float = Field(default=5.0, ge=0)
    # On SIGTERM the gate first reports NOT_SERVING and keeps serving this long, so the
    # proxies' health checks (every 2 s, 2 failures) stop sending it new streams; then open
    # streams get grace_seconds. SIGINT (and the supervisor's death) skips the drain.
    drain_seconds: float = Field(default=6.0, ge=0)
    # Envoy's ext_proc message_timeout and max_message_timeout: a request that may wait
    # longer (queue, coalescing) first asks Envoy for more time (override_message_timeout).
    envoy_message_timeout_ms: float = Field(default=35_000.0, gt=0)
    envoy_max_message_timeout_ms: float = Field(default=240_000.0, gt=0)
    access_log: bool = True  # one JSON line per request (logger llm_gate.access)
    # OpenTelemetry: a span per request and per stage, continuing the request's traceparent,
    # exported over OTLP/HTTP as the standard OTEL_* variables say (pip install llm-gate[tracing]).
    tracing: bool = False
    # The admin endpoint's own bind address (not `host`): keep it on loopback or a trusted network.
    admin_host: str = "127.0.0.1"
    # Bearer token the admin endpoint requires (`authorization: Bearer TOKEN`), read from this
    # file or, when no file is set, from this environment variable. Required off loopback.
    admin_token_file: Path | None = None
    admin_token_env: str = "LLM_GATE_ADMIN_TOKEN"
    # TLS on the gRPC port (None: plaintext, for loopback or a mesh sidecar that adds mTLS).
    tls: ServerTLS | None = None


class Store(Strict):
    # None: the in-process store (one process only). "redis://127.0.0.1:6379/0" to share
    # (the same as `redis: {mode: single, url: ...}`).
    redis_url: str | None = None
    # Single node, Sentinel or Cluster, with credentials from files or the environment
    # (extproc/redis_config.py, docs/redis.md).
    redis: RedisTopology | None = None
    # While the store is up, a call may take this long before the request goes on without
    # it: long enough that an event loop busy with a burst is not mistaken for an outage.
    op_timeout_ms: float = Field(default=100.0, gt=0)
    # The store is down after this many failures in a row (or a failed probe): calls are then
    # skipped at once until a ping every `probe_interval_ms` finds it back.
    down_after: int = Field(default=3, ge=1)
    probe_interval_ms: float = Field(default=500.0, gt=0)

    @model_validator(mode="after")
    def _one_redis(self) -> Store:
        if self.redis_url is not None and self.redis is not None:
            raise ValueError("set store.redis or store.redis_url, not both")
        if self.redis_url is not None:
            check_url(self.redis_url)
        return self

    @property
    def topology(self) -> RedisTopology | None:
        """The Redis to share state through; None: the in-process store."""
        if self.redis is not None:
            return self.redis
        return None if self.redis_url is None else RedisTopology(url=self.redis_url)


class RequestRate(Strict):
    rate: float = Field(gt=0)  # requests per second, sustained
    burst: int = Field(ge=1)  # requests at once from a full bucket


class TierLimits(Strict):
    tenant: RequestRate | None = None
    user: RequestRate | None = None  # per user (x-user-id or the key's user) and route
    ip: RequestRate | None = None


class RepeatBlock(Strict):
    # One caller sending the same normalised prompt more than `max_repeats` times in
    # `window_s` is blocked for `block_s`. Off by default: load tests and services that
    # repeat a prompt on purpose (the dedup cache makes that cheap) would be blocked.
    enabled: bool = False
    max_repeats: int = Field(default=10, ge=1, le=1000)  # arrivals are kept one by one
    window_s: float = Field(default=1.0, gt=0, le=3600)
    block_s: float = Field(default=60.0, gt=0)


class RateLimit(Strict):
    enabled: bool = True
    tiers: dict[Tier, TierLimits] = Field(default_factory=dict)
    routes: dict[str, RequestRate] = Field(default_factory=dict)  # per path, shared by every caller
    repeat: RepeatBlock = RepeatBlock()
    # Proxies in front of Envoy whose x-forwarded-for entries are trusted (Envoy appends its peer).
    trusted_hops: int = Field(default=0, ge=0)
    # While the store cannot be reached, limits are skipped, except on these path prefixes and
    # for these tiers, which are answered 503 (retry-after: 1).
    fail_closed_paths: list[str] = Field(default_factory=list)
    fail_closed_tiers: list[Tier] = Field(default_factory=list)
    key_prefix: str = "gate:rl:"


class Webhook(Strict):
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=2.0, gt=0)  # one attempt
    retries: int = Field(default=4, ge=0)
    backoff_s: float = Field(default=0.5, gt=0)  # doubles per retry, with jitter
    deadline_s: float = Field(default=30.0, gt=0)  # all attempts of one notice together


class AdaptiveLimit(Strict):
    """While a pool's breaker is CLOSED: P95 above breaker.close_p95_s with throughput below
    `drop` × its recent peak shrinks admission capacity by `decrease`, down to `floor`;
    a P95 back under close_p95_s grows it by `increase` per sync tick, up to all of it."""

    enabled: bool = True
    floor: float = Field(default=0.25, gt=0, le=1)
    decrease: float = Field(default=0.8, gt=0, lt=1)
    increase: float = Field(default=0.05, gt=0, le=1)
    drop: float = Field(default=0.9, gt=0, le=1)
    peak_half_life_s: float = Field(default=60.0, gt=0)


class Breaker(Strict):
    """Latency circuit breaker per pool (extproc/breaker/); seed values as defaults."""

    enabled: bool = True
    window_s: float = Field(default=60.0, gt=0)
    slices: int = Field(default=20, ge=1, le=600)  # the window moves one slice at a time
    min_samples: int = Field(default=20, ge=1)
    open_p95_s: float = Field(default=2.5, gt=0)
    close_p95_s: float = Field(default=1.8, gt=0)
    max_error_rate: float = Field(default=0.2, gt=0, le=1)
    hold_s: float = Field(default=30.0, ge=0)  # least time in CLOSED or OPEN
    recovery_s: float = Field(default=300.0, ge=0)  # P95 under close_p95_s this long → CLOSED
    probe_share: float = Field(default=0.01, ge=0, le=1)  # HALF_OPEN: share sent to the primary
    probe_interval_s: float | None = Field(default=5.0, gt=0)  # and at least one probe this often
    probe_min_samples: int = Field(default=5, ge=1)
    # Streams: "ttft" streams the response body through the gate to time the first chunk;
    # "total" times the whole stream for free. JSON is always total (headers come last).
    stream_signal: Literal["ttft", "total"] = "ttft"
    sync_interval_s: float = Field(default=0.5, gt=0, le=1.0)
    sync_timeout_ms: float = Field(default=250.0, gt=0)
    key_prefix: str = "gate:breaker:"
    webhook: Webhook | None = None
    adaptive: AdaptiveLimit = AdaptiveLimit()

    @model_validator(mode="after")
    def _close_below_open(self) -> Breaker:
        if self.close_p95_s > self.open_p95_s:
            raise ValueError("close_p95_s must not exceed open_p95_s")
        return self


class CacheCoalesce(Strict):
    enabled: bool = True
    # A follower waits for its leader at most this long, and never past its admission deadline
    # (admission.deadline_ms of its class): as long as it would have waited for a slot.
    max_wait_s: float = Field(default=30.0, gt=0)
    # A leader's lease: renewed every third of it while the answer arrives, so a leader whose
    # process died is replaced within this long.
    lease_s: float = Field(default=3.0, gt=0)
    poll_ms: float = Field(default=5.0, gt=0)  # first re-check of the store; doubles up to poll_max_ms
    poll_max_ms: float = Field(default=250.0, gt=0)


class CacheLocal(Strict):
    """Each process's own copy of the exact entries it served or stored last (cache/hot.py):
    a repeated question needs no store round trip. Purges reach every process's copy."""

    max_mb: float = Field(default=32.0, ge=0)  # 0: off
    ttl_s: float = Field(default=60.0, gt=0)  # at most this long, and never past the entry's TTL


class SemanticProfile(Strict):
    """Another embedder or operating point for some tenants or routes (first match wins)."""

    tenant: str | None = None
    path_prefix: str | None = None
    enabled: bool = True
    embedder: str | None = None  # None: the default embedder
    policy_file: Path | None = None
    target_precision: float | None = Field(default=None, gt=0, le=1)
    # None: the default's centre when the profile keeps the default embedder, else no centre.
    lsh_center_file: Path | None = None

    def applies(self, tenant: str, path: str) -> bool:
        return (self.tenant is None or self.tenant == tenant) and (
            self.path_prefix is None or path.startswith(self.path_prefix)
        )


class CacheSelfCheck(Strict):
    """Self-calibration from live traffic (extproc/dedup/selfcheck.py): a semantic candidate is
    served only from a bin (tenant, language, verifier-score bin) whose checked precision has a
    95% lower bound at or above `target`; its other candidates, and `share` of a serving bin's,
    go upstream and their fresh answer is compared with the cached one."""

    enabled: bool = False
    share: float = Field(default=0.03, ge=0, le=1)  # of a serving bin's candidates, still checked
    target: float | None = Field(default=None, gt=0, lt=1)  # None: cache.semantic.target_precision
    min_checks: int = Field(default=30, ge=1)  # a bin serves on no fewer checks than this
    # A bin whose shipped selection pairs prove the target starts with just enough of them to
    # serve (false: every bin starts from nothing).
    prior: bool = True
    # Of a bin serving with fewer than `min_checks` live checks (on its prior), still checked.
    warm_share: float = Field(default=0.25, ge=0, le=1)
    # Lower edges of the verifier-score bins, rising; a score under the first is never a candidate.
    bins: list[float] = Field(default_factory=lambda: [0.6, 0.8, 0.9], min_length=1)
    # Two answers whose normalised texts differ still agree at this cosine of their embeddings.
    answer_similarity: float = Field(default=0.97, gt=0, le=1)
    key_prefix: str = "gate:sc:"

    @model_validator(mode="after")
    def _bins_rise(self) -> CacheSelfCheck:
        if any(b <= a for a, b in zip(self.bins, self.bins[1:], strict=False)):
            raise ValueError("bins must rise")
        if not all(0 <= b < 1 for b in self.bins):
            raise ValueError("bins are verifier scores in [0, 1)")
        return self


class CacheSemantic(Strict):
    enabled: bool = True
    embedder: str = "minilm"  # a name known to extproc.embed.load_embedder
    model_dir: Path | None = None  # None: $LLM_GATE_MODEL_DIR or ~/.cache/llm-gate/models
    build_missing: bool = True  # build the model at start when it is not there (a few seconds)
    policy_file: Path | None = None  # None: the shipped calibration (extproc/dedup/verifier.json)
    target_precision: float = Field(default=0.95, gt=0, le=1)
    # The trained pair judge (extproc/dedup/judge.py) decides the candidates past the cosine
    # floor and the guards, at its own measured operating points, instead of the verifier. It
    # reads e5-small token states: it needs embedder e5-small (docs/pair-judge.md).
    judge: bool = False
    judge_dir: Path | None = None  # None: the shipped judge (extproc/dedup/judge.onnx + judge.json)
    # LSH: None chooses rows/bands for the policy's lowest cosine floor at lsh_recall.
    lsh_rows: int | None = Field(default=None, ge=1, le=63)
    lsh_bands: int | None = Field(default=None, ge=1, le=256)
    lsh_recall: float = Field(default=0.995, gt=0, lt=1)
    lsh_seed: int = 0
    max_candidates: int = Field(default=128, ge=1)  # load/results/lsh_recall.md
    # The traffic's mean embedding (`llm-gate lsh-center`, a float32 .npy and its .json), hashed
    # around: prompts sharing a long template then spread over the buckets instead of filling a
    # few (whose cap evicts true matches). Only candidates change; cosines stay the raw ones.
    lsh_center_file: Path | None = None
    embed_timeout_ms: float = Field(default=500.0, gt=0)
    batch_window_ms: float = Field(default=1.0, ge=0)
    # e.g. [{tenant: acme-cn, embedder: e5-small}]: Chinese-speaking tenants on the multilingual model
    profiles: list[SemanticProfile] = Field(default_factory=list)
    # ONNX intra-op threads per inference and batches in flight per gate process. None: from the
    # cores available (two batches once there are two cores; the cores shared among processes).
    embed_threads: int | None = Field(default=None, ge=1)
    embed_workers: int | None = Field(default=None, ge=1)
    # Texts waiting for an embedding beyond this, or whose wait would pass embed_timeout_ms,
    # take the exact path at once (gate_embed_shed_total), not after the time-out.
    embed_max_queue: int = Field(default=256, ge=1)
    # A leader announces its request while the model runs (one more store call beside it), so
    # a paraphrase judged the same question waits for that answer instead of calling the model.
    join_in_flight: bool = True
    self_check: CacheSelfCheck = CacheSelfCheck()

    def for_profile(self, profile: SemanticProfile) -> CacheSemantic:
        """This section with the profile's choices in place of the defaults. A centre belongs to
        one embedder: a profile that picks another one keeps no centre but its own."""
        keys = ("embedder", "policy_file", "target_precision", "lsh_center_file")
        chosen: dict[str, object] = {k: v for k in keys if (v := getattr(profile, k))}
        if profile.lsh_center_file is None and chosen.get("embedder", self.embedder) != self.embedder:
            chosen["lsh_center_file"] = None
        return self.model_copy(update={**chosen, "enabled": profile.enabled, "profiles": []})


class Cache(Strict):
    """Exact + semantic answer cache and in-flight coalescing (extproc/cache/)."""

    enabled: bool = True
    shared_across_tenants: bool = False  # True: every tenant reads every tenant's answers
    ttl_s: float = Field(default=3600.0, gt=0)
    max_entries_per_scope: int = Field(default=10_000, ge=1)
    max_entry_bytes: int = Field(default=1_048_576, gt=0)
    max_temperature: float = Field(default=1.0, ge=0)  # no temperature in the request counts as 1.0
    cache_tool_calls: bool = False
    alias_ttl_s: float = Field(default=300.0, gt=0)  # a paraphrase's own exact entry
    # Time box of each cache store call; None: store.op_timeout_ms. A hit saves a whole
    # generation, so the cache may wait longer than the cheap checks before it.
    op_timeout_ms: float | None = Field(default=None, gt=0)
    coalesce: CacheCoalesce = CacheCoalesce()
    local: CacheLocal = CacheLocal()
    semantic: CacheSemantic = CacheSemantic()


def _yaml_off(value: object) -> object:
    """YAML reads a bare `off` as false: in a mode, it means "off"."""
    return "off" if value is False else value


class Sanitize(Strict):
    """Hidden characters in prompt text (extproc/safety/sanitize.py): strip them (default),
    reject the request with a 400, or leave the text alone."""

    mode: Annotated[Literal["strip", "reject", "off"], BeforeValidator(_yaml_off)] = "strip"


GuardrailKind = Literal["card", "cn_id", "phone", "email", "iban"]
GUARDRAIL_KINDS: tuple[GuardrailKind, ...] = ("card", "cn_id", "phone", "email", "iban")


class Guardrail(Strict):
    """Redaction of personal data in answers, for the tenants listed (extproc/safety/redact.py)."""

    tenants: list[str] = Field(default_factory=list)
    kinds: list[GuardrailKind] = Field(default_factory=lambda: list(GUARDRAIL_KINDS))


ScreenMode = Annotated[Literal["off", "monitor", "block"], BeforeValidator(_yaml_off)]


class Screen(Strict):
    """The injection / jailbreak screen on the last user message's embedding (docs/safety.md):
    `monitor` forwards and flags, `block` answers 400 `prompt_injection`."""

    mode: ScreenMode = "off"  # for tenants and routes not listed below
    tenants: dict[str, ScreenMode] = Field(default_factory=dict)
    routes: dict[str, ScreenMode] = Field(default_factory=dict)  # path prefix -> mode, longest match
    threshold: float | None = Field(default=None, gt=0, lt=1)  # None: the head's trained one
    tier_thresholds: dict[Tier, float] = Field(default_factory=dict)  # per tier, in place of `threshold`
    elevated_threshold: float | None = Field(default=None, gt=0, lt=1)  # keys with `risk: elevated`
    head_file: Path | None = None  # None: the shipped head (extproc/data/screen_head.npz)
    model_dir: Path | None = None  # None: $LLM_GATE_MODEL_DIR or ~/.cache/llm-gate/models
    embed_timeout_ms: float = Field(default=1000.0, gt=0)
    memo_size: int = Field(default=10_000, ge=0)  # verdicts kept by text: a repeat is not embedded again
    # With a shared store (store.redis), verdicts are kept there too this long, so a text any
    # gate process screened is not embedded again by another; 0: each process on its own.
    shared_ttl_s: float = Field(default=86_400.0, ge=0)
    key_prefix: str = "gate:screen:"
    max_messages: int = Field(default=8, ge=1)  # one by one, newest first; older new ones as one text
    # Of a text past the window (its first and last 2,048 characters), the pieces of its middle
    # whose n-grams weigh highest, embedded and scored too (one embedding each); 0: the middle
    # is not read (each piece read adds a little to the false positives of long texts).
    middle_pieces: int = Field(default=4, ge=0)

    @model_validator(mode="after")
    def _route_prefixes(self) -> Screen:
        bad = [r for r in self.routes if not r.startswith("/")]
        if bad:
            raise ValueError(f"screen.routes keys are path prefixes starting with '/'; got {bad}")
        return self

    def mode_for(self, tenant: str, path: str) -> ScreenMode:
        """The tenant's own mode, else the longest listed route prefix of the path's, else `mode`."""
        if tenant in self.tenants:
            return self.tenants[tenant]
        prefixes = [p for p in self.routes if path.startswith(p)]
        return self.routes[max(prefixes, key=len)] if prefixes else self.mode

    @property
    def enabled(self) -> bool:
        modes = [self.mode, *self.tenants.values(), *self.routes.values()]
        return any(m != "off" for m in modes)


class Config(Strict):
    server: Server = Server()
    store: Store = Store()
    identity: Identity = Identity()
    validation: Validation = Validation()
    routing: Routing = Routing()
    breaker: Breaker = Breaker()
    ratelimit: RateLimit = RateLimit()
    cache: Cache = Cache()
    admission: Admission = Admission()
    sources: Sources = Sources()
    sanitize: Sanitize = Sanitize()
    guardrail: Guardrail = Guardrail()
    screen: Screen = Screen()


class ConfigError(Exception):
    """Raised with every problem in the file, one per line, each with its path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: the top level must be a mapping"])
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError([_describe(source, err) for err in exc.errors()]) from exc


def _describe(source: str, err: object) -> str:
    assert isinstance(err, dict)
    where = ".".join(str(part) for part in err.get("loc", ())) or "(top level)"
    return f"{source}: {where}: {err.get('msg')}"


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    return parse_config(path.read_text(encoding="utf-8"), str(path))


def load_config_or_report(path: Path | None) -> Config | None:
    """The config for a command line tool; None after printing its problems to stderr."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return None
