"""Assemble the cache stage at start: store, policy, embedder (built and warmed if needed).

Runs before the gRPC health status says SERVING, so the first request never waits for a
model to load. A model that cannot be built or loaded, or an LSH centre file that is not a
centre of this embedder, stops the gate with a message that says what to do; a missing
calibration file only turns the semantic layer off.
"""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..config import CacheSemantic as SemanticConfig
from ..config import SemanticProfile
from ..dedup.decide import Policy
from ..metrics import Metrics
from ..redis_client import connect_sync
from ..redis_config import RedisTopology
from .center import check_dim, read_center
from .redis_store import CANDIDATES, LOOKUP, PUT, RELEASE, RENEW, RedisStore
from .semantic import Matcher
from .store import MemoryStore, Store

log = logging.getLogger("llm_gate.cache")

Profile = tuple[SemanticProfile, Matcher | None]
WARMUP = ("warm up", "How do I reset my password?", "怎么开通花呗", "a somewhat longer sentence " * 8)


class ModelError(RuntimeError):
    pass


def ensure_model(name: str, model_dir: Path, build_missing: bool) -> None:
    """Build the embedder's model into `model_dir` when it is not there (a few seconds)."""
    if (model_dir / name / "embedder.json").exists() or (model_dir / "embedder.json").exists():
        return
    from ..embed.build import MODELS
    from ..embed.build import main as build

    if name not in MODELS or not build_missing:
        raise ModelError(
            f"no '{name}' model under {model_dir}. Build it with `python -m extproc.embed.build --out "
            f"{model_dir}` or set cache.semantic.model_dir to where it is (or cache.semantic.enabled: false)."
        )
    model_dir.mkdir(parents=True, exist_ok=True)
    with open(model_dir / ".build.lock", "w") as lock:  # gate workers start together: one builds
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (model_dir / name / "embedder.json").exists():
            log.info("building the %s embedder into %s", name, model_dir)
            if build(["--out", str(model_dir), "--only", name]) != 0:
                raise ModelError(f"building the '{name}' model into {model_dir} failed; see the log above")


def semantic_policy(cfg: SemanticConfig) -> Policy:
    """What the matcher decides by, read from the calibration files alone (no model): the
    verifier's points, or the judge's. FileNotFoundError: no calibration file; ValueError:
    a judge trained on another embedder."""
    from ..dedup.decide import load_policy

    policy = load_policy(cfg.embedder, cfg.target_precision, cfg.policy_file)
    if not cfg.judge:
        return policy
    from ..dedup.judge import judge_policy

    return judge_policy(cfg.embedder, cfg.target_precision, cfg.judge_dir)


def load_matcher(cfg: SemanticConfig, metrics: Metrics, processes: int = 1) -> Matcher | None:
    # Read first: a centre file that cannot be used stops the start before any model loads.
    center = read_center(cfg.lsh_center_file, cfg.embedder) if cfg.lsh_center_file else None
    try:
        policy = semantic_policy(cfg)
    except FileNotFoundError as exc:
        log.warning("semantic cache off: no calibration file (%s)", exc)
        return None
    except ValueError as exc:
        raise ModelError(f"cache.semantic.judge: {exc}; set cache.semantic.embedder: e5-small") from exc
    judge = None
    if cfg.judge:
        from ..dedup.judge import load_judge

        judge = load_judge(cfg.judge_dir)
    if cfg.self_check.enabled:
        from .selfcheck import open_policy

        policy = open_policy(policy, cfg.self_check.bins[0])
    from .semantic import floor

    if floor(policy) is None:
        log.info("semantic cache off: %s reaches the precision target in no language", cfg.embedder)
        return None
    from ..embed import BatchingEmbedder, BatchReport, default_model_dir, shared_embedder
    from ..embed.batching import default_threads, default_workers

    model_dir = cfg.model_dir or default_model_dir()
    ensure_model(cfg.embedder, model_dir, cfg.build_missing)
    try:
        workers = cfg.embed_workers or default_workers()
        threads = cfg.embed_threads or default_threads(processes=processes, workers=workers)
        inner = shared_embedder(cfg.embedder, model_dir, threads=threads)
        inner.embed_sync(list(WARMUP))
    except Exception as exc:
        raise ModelError(f"cannot load the '{cfg.embedder}' embedder from {model_dir}: {exc}") from exc
    if center is not None and cfg.lsh_center_file is not None:
        check_dim(center, cfg.lsh_center_file, cfg.embedder, inner.dim)
        log.info("LSH hashes around %s (norm %.3f)", cfg.lsh_center_file, float(np.linalg.norm(center)))

    def observe(report: BatchReport) -> None:
        metrics.embed_batch_size.observe(report.size)
        metrics.embed_seconds.observe(report.infer_s)
        for wait in report.queue_waits:
            metrics.embed_queue_seconds.observe(wait)

    embedder = BatchingEmbedder(
        inner, window_s=cfg.batch_window_ms / 1000, workers=workers, max_queue=cfg.embed_max_queue,
        timeout_s=cfg.embed_timeout_ms / 1000, on_batch=observe,
        on_shed=lambda reason: metrics.embed_shed.labels(reason).inc(),
    )
    return Matcher.create(
        embedder, policy, rows=cfg.lsh_rows, bands=cfg.lsh_bands, recall=cfg.lsh_recall, seed=cfg.lsh_seed,
        max_candidates=cfg.max_candidates, center=center, judge=judge,
    )


class Matchers:
    """The default matcher and one per profile (another embedder or operating point for some
    tenants or routes); profiles that choose the same thing share one."""

    def __init__(self, default: Matcher | None, profiles: list[Profile]) -> None:
        self.default = default
        self.profiles = profiles

    def for_request(self, tenant: str, path: str) -> Matcher | None:
        for profile, matcher in self.profiles:
            if profile.applies(tenant, path):
                return matcher
        return self.default

    async def aclose(self) -> None:
        every = [self.default, *(m for _, m in self.profiles)]
        for m in {id(m): m for m in every if m is not None}.values():
            close = getattr(m.embedder, "aclose", None)
            if close is not None:
                await close()


def load_matchers(cfg: SemanticConfig, metrics: Metrics, processes: int = 1) -> Matchers:
    loaded: dict[tuple[object, ...], Matcher | None] = {}

    def matcher_for(section: SemanticConfig) -> Matcher | None:
        key = (section.enabled, section.embedder, section.policy_file, section.target_precision,
               section.lsh_center_file, section.judge, section.judge_dir)
        if key not in loaded:
            loaded[key] = load_matcher(section, metrics, processes) if section.enabled else None
        return loaded[key]

    profiles = [(p, matcher_for(cfg.for_profile(p))) for p in cfg.profiles]
    return Matchers(matcher_for(cfg), profiles)


def preload_scripts(topology: RedisTopology) -> None:
    """Load the Lua scripts once (on every master of a Cluster), so the first time-boxed call
    is not spent on SCRIPT LOAD."""
    import redis

    try:
        client: Any = connect_sync(topology, timeout_s=1.0)
        for script in (LOOKUP, CANDIDATES, PUT, RELEASE, RENEW):
            client.script_load(script)
        client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        log.warning("could not preload cache scripts (%s); they load on first use", exc)


def answer_store(redis: Any, topology: RedisTopology | None) -> Store:
    """The answers' store for one process: Redis when configured, else in memory."""
    if redis is None:
        return MemoryStore()
    if topology is not None:
        preload_scripts(topology)
    return RedisStore(redis)
