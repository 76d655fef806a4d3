"""The gate's configuration: one YAML file, validated at start.

Every threshold has a default, so an empty file is a working embedded gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Tier = Literal["vip", "premium", "standard"]
TIERS: tuple[Tier, ...] = ("vip", "premium", "standard")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Caller(Strict):
    tenant: str
    tier: Tier = "standard"
    user: str | None = None


class Identity(Strict):
    api_keys: dict[str, Caller] = Field(default_factory=dict)
    anonymous: Caller = Caller(tenant="anonymous", tier="standard")
    unknown_keys: Literal["anonymous", "reject"] = "anonymous"
    # Only when an upstream auth filter (ext_authz, Istio RequestAuthentication) sets them.
    trust_identity_headers: bool = False
    tenant_header: str = "x-tenant-id"
    tier_header: str = "x-tenant-tier"


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


class Pool(Strict):
    cluster: str
    # Model name the pool's servers know; requests are rewritten to it when it differs.
    served_model: str | None = None
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    fallback: str | None = None


class Rule(Strict):
    pool: str
    path_prefix: str | None = None
    scene_prefix: str | None = None


class Routing(Strict):
    handled_paths: list[str] = Field(default_factory=lambda: ["/v1/chat/completions", "/v1/completions"])
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

    @model_validator(mode="after")
    def _pools_exist(self) -> Routing:
        named = [("default_pool", self.default_pool)] if self.default_pool else []
        named += [(f"models.{m}", p) for m, p in self.models.items()]
        named += [(f"rules.{i}.pool", r.pool) for i, r in enumerate(self.rules)]
        named += [(f"pools.{n}.fallback", p.fallback) for n, p in self.pools.items() if p.fallback]
        missing = [f"{where}: unknown pool {pool!r}" for where, pool in named if pool not in self.pools]
        if missing:
            raise ValueError("; ".join(missing))
        return self


class Server(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    metrics_port: int | None = Field(default=9464, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    grace_seconds: float = Field(default=5.0, ge=0)


class Store(Strict):
    # None: the in-process store (one process only). "redis://127.0.0.1:6379/0" to share.
    redis_url: str | None = None
    # Every store call is time-boxed; past this the request goes on without the store.
    op_timeout_ms: float = Field(default=5.0, gt=0)


class Config(Strict):
    server: Server = Server()
    store: Store = Store()
    identity: Identity = Identity()
    validation: Validation = Validation()
    routing: Routing = Routing()


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
