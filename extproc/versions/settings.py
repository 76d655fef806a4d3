"""Config of model versions: `routing.versions` (versions, weights, rollout) and `sources`.

Kept beside the versions code so `config.py` only names the sections. A model listed under
`routing.versions` is served by one or more versions, each a pool with a weight; a model
listed only under `routing.models` keeps its single pool, as before.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelVersion(_Strict):
    name: str = Field(min_length=1)  # shown in x-gate-version, the access line and the metrics
    pool: str  # a pool of routing.pools (an Envoy cluster)
    # Share of the model's callers, in percent of all its versions' weights together.
    weight: float = Field(default=0.0, ge=0)
    # The version under test: `x-canary: true` reaches it (for keys that allow it), a traffic
    # override (etcd, `llm-gate versions`) and a rollout set its weight.
    canary: bool = False


class Rollout(_Strict):
    """Progressive delivery of the canary: weight steps up while it does no worse than stable."""

    steps: list[float] = Field(default_factory=lambda: [5.0, 25.0, 50.0, 100.0], min_length=1)
    hold_s: float = Field(default=300.0, gt=0)  # each step held this long before the next
    # The canary is worse, and is rolled back to 0 at once, when over the step's window
    # its error rate exceeds stable's by more than `max_error_rate_increase`, or its P95
    # exceeds `max_p95_ratio` × stable's P95 + `p95_slack_s`.
    max_error_rate_increase: float = Field(default=0.05, ge=0, le=1)
    max_p95_ratio: float = Field(default=1.5, ge=1)
    p95_slack_s: float = Field(default=0.05, ge=0)
    min_samples: int = Field(default=20, ge=1)  # canary calls before any verdict or step
    window_s: float = Field(default=30.0, gt=0)  # at most this much of the step is compared
    slices: int = Field(default=30, ge=1, le=600)

    @model_validator(mode="after")
    def _steps_rise(self) -> Rollout:
        if any(b <= a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError("steps must rise")
        if not all(0 < s <= 100 for s in self.steps):
            raise ValueError("steps are percentages in (0, 100]")
        return self


class VersionedModel(_Strict):
    versions: list[ModelVersion] = Field(min_length=1)
    # True: a cached answer from one version may answer a caller routed to another.
    share_cache: bool = False
    rollout: Rollout | None = None

    @model_validator(mode="after")
    def _one_canary(self) -> VersionedModel:
        names = [v.name for v in self.versions]
        if len(set(names)) != len(names):
            raise ValueError("version names must be unique")
        canaries = [v for v in self.versions if v.canary]
        if len(canaries) > 1:
            raise ValueError("at most one version is the canary")
        if not canaries and sum(v.weight for v in self.versions) <= 0:
            raise ValueError("at least one version needs a weight above 0")
        if self.rollout is not None and (not canaries or len(self.versions) < 2):
            raise ValueError("a rollout needs a canary version and a stable one")
        return self

    @property
    def canary(self) -> ModelVersion | None:
        return next((v for v in self.versions if v.canary), None)

    def named(self, name: str) -> ModelVersion | None:
        return next((v for v in self.versions if v.name == name), None)


class Etcd(_Strict):
    """An etcd key prefix overlaid on `routing.versions` (the seed's layout):
    `{prefix}{model}/version` names the stable version, `{prefix}{model}/traffic` the
    canary's share ("15%")."""

    host: str = "127.0.0.1"
    port: int = Field(default=2379, ge=1, le=65535)
    prefix: str = "/models/"
    timeout_s: float = Field(default=5.0, gt=0)
    retry_s: float = Field(default=1.0, gt=0)  # a lost watch is re-opened after this long


class Sources(_Strict):
    """Where config changes come from besides SIGHUP (both change only on restart)."""

    # Re-read the config file when it changes (a ConfigMap mount swaps its `..data` link):
    # the resolved file's inode, size and mtime are polled this often. None: off.
    watch_file_s: float | None = Field(default=None, gt=0)
    etcd: Etcd | None = None


RolloutPhase = Literal["rolling", "done", "rolled_back", "manual"]


class VersionSync(_Strict):
    """How the gates share rollout state and per-version windows (Redis: store.redis_url)."""

    interval_s: float = Field(default=0.5, gt=0, le=5)
    timeout_ms: float = Field(default=250.0, gt=0)
    key_prefix: str = "gate:versions:"
