"""Route: model / path / scene → version → pool; sets `x-gate-cluster` and rewrites `model`.

A model under `routing.versions` is served by the version its caller's key hashes to
(sticky: see extproc/versions/choose.py), or by its canary when the caller's key allows
`x-canary: true` and sends it. The version is told to the client (`x-gate-version`), the
access line and the metrics; its upstream outcome feeds the version's rollout window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import Routing
from ..errors import error_reply
from ..exchange import Exchange, Reply
from ..versions.choose import Share, caller_key, choose_version
from ..versions.settings import VersionedModel
from ..versions.traffic import Traffic
from .base import Stage

if TYPE_CHECKING:
    from ..config import Config
    from ..metrics import Metrics
    from ..services import Services
    from ..versions.monitor import VersionMonitor

CLUSTER_HEADER = "x-gate-cluster"
VERSION_HEADER = "x-gate-version"
CANARY_HEADER = "x-canary"


def rule_pool(routing: Routing, path: str, scene: str) -> str | None:
    for rule in routing.rules:
        if rule.path_prefix is not None and not path.startswith(rule.path_prefix):
            continue
        if rule.scene_prefix is not None and not scene.startswith(rule.scene_prefix):
            continue
        return rule.pool
    return None


def choose_pool(routing: Routing, model: str, path: str, scene: str) -> str | None:
    """Rules first (in order), then the model map, then the default pool (unversioned)."""
    return rule_pool(routing, path, scene) or routing.models.get(model, routing.default_pool)


def wants_canary(headers: dict[str, str], allowed: bool) -> bool:
    """`x-canary: true` counts only from a caller whose key allows it; from anyone else it is ignored."""
    return allowed and headers.get(CANARY_HEADER, "").strip().lower() == "true"


@dataclass
class VersionCall:
    model: str
    version: str
    pool: str


class Route(Stage):
    name = "route"
    store_down = "not used"
    fail_closed = True  # an unrouted request must not reach whichever pool is the default

    def __init__(
        self,
        routing: Routing,
        traffic: Traffic | None = None,
        monitor: VersionMonitor | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.routing = routing
        self.traffic = traffic if traffic is not None else Traffic()
        self.monitor = monitor
        self.metrics = metrics
        # Each pool's own key for its servers, read once (a missing one stops the gate at start).
        keys = {name: pool.upstream_key() for name, pool in routing.pools.items()}
        self.auth = {name: f"Bearer {key}" for name, key in keys.items() if key}

    @classmethod
    def build(cls, config: Config, services: Services) -> Route:
        return cls(config.routing, services.traffic, services.versions, services.metrics)

    def runs(self, hook: str) -> bool:
        return hook == "on_request" or (hook == "on_done" and bool(self.routing.versions))

    async def on_request(self, ex: Exchange) -> Reply | None:
        assert ex.payload is not None
        model = ex.payload["model"]
        scene = ex.headers.get(self.routing.scene_header, "")
        pool_name = rule_pool(self.routing, ex.route_path, scene)
        versioned = self.routing.versions.get(model) if pool_name is None else None
        if versioned is not None:
            pool_name = self.choose(ex, model, versioned).pool
        elif pool_name is None:
            pool_name = self.routing.models.get(model, self.routing.default_pool)
        if pool_name is None:
            known = ", ".join(sorted({*self.routing.models, *self.routing.versions})) or "none"
            return error_reply(
                404,
                f"The model '{model}' does not exist here. Models served: {known}.",
                param="model",
                code="model_not_found",
            )
        self.send_to(ex, pool_name)
        return None

    def choose(self, ex: Exchange, model: str, versioned: VersionedModel) -> Share:
        """The caller's version, recorded on the exchange (header, cache scope, outcome)."""
        canary = versioned.canary
        if canary is not None and wants_canary(ex.headers, ex.may_use_canary):
            chosen = Share(canary.name, canary.pool, 1.0, canary=True)
        else:
            table = self.traffic.table(model, versioned)
            chosen = choose_version(table, caller_key(ex.tenant, ex.user, model))
        ex.version = chosen.name
        ex.cache_version = None if versioned.share_cache else chosen.name
        ex.client_headers[VERSION_HEADER] = chosen.name
        ex.state[self.name] = VersionCall(model, chosen.name, chosen.pool)
        if self.metrics is not None:
            self.metrics.version_requests.labels(model, chosen.name).inc()
        return chosen

    async def on_done(self, ex: Exchange) -> None:
        call = ex.state.pop(self.name, None)
        if not isinstance(call, VersionCall) or ex.upstream_started is None or ex.pool != call.pool:
            return  # answered by the gate (a cache hit, a refusal) or moved to a fallback pool
        status = ex.status
        if status is not None and 400 <= status < 500:
            return  # the caller's mistake, not the version's
        error = status is None or status >= 500
        latency = None if error else time.perf_counter() - ex.upstream_started
        if self.metrics is not None:
            if error:
                self.metrics.version_errors.labels(call.model, call.version).inc()
            else:
                self.metrics.version_latency.labels(call.model, call.version).observe(latency or 0.0)
        if self.monitor is not None:
            self.monitor.record(call.model, call.version, latency, error)

    def send_to(self, ex: Exchange, pool_name: str) -> None:
        """Point the exchange at a pool, rewriting the body's model if the pool needs it."""
        assert ex.payload is not None
        pool = self.routing.pools[pool_name]
        ex.pool = pool_name
        ex.upstream_headers[CLUSTER_HEADER] = pool.cluster
        auth = self.auth.get(pool_name)
        if auth is not None:
            ex.upstream_headers["authorization"] = auth
        else:
            ex.upstream_headers.pop("authorization", None)
        ex.client_headers[CLUSTER_HEADER] = pool.cluster
        if pool.served_model and pool.served_model != ex.payload["model"]:
            ex.payload["model"] = pool.served_model
            ex.payload_changed = True
