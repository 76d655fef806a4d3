"""Route: model / path / scene → pool; sets `x-gate-cluster` and rewrites `model`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from ..config import Routing
from ..errors import error_reply
from ..exchange import Exchange, Reply
from .base import Stage

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services

CLUSTER_HEADER = "x-gate-cluster"


def choose_pool(routing: Routing, model: str, path: str, scene: str) -> str | None:
    """Rules first (in order), then the model map, then the default pool."""
    for rule in routing.rules:
        if rule.path_prefix is not None and not path.startswith(rule.path_prefix):
            continue
        if rule.scene_prefix is not None and not scene.startswith(rule.scene_prefix):
            continue
        return rule.pool
    return routing.models.get(model, routing.default_pool)


class Route(Stage):
    name = "route"
    store_down = "not used"
    fail_closed = True  # an unrouted request must not reach whichever pool is the default

    def __init__(self, routing: Routing) -> None:
        self.routing = routing
        # Each pool's own key for its servers, read once (a missing one stops the gate at start).
        keys = {name: pool.upstream_key() for name, pool in routing.pools.items()}
        self.auth = {name: f"Bearer {key}" for name, key in keys.items() if key}

    @classmethod
    def build(cls, config: Config, services: Services) -> Route:
        return cls(config.routing)

    async def on_request(self, ex: Exchange) -> Reply | None:
        assert ex.payload is not None
        model = ex.payload["model"]
        scene = ex.headers.get(self.routing.scene_header, "")
        pool_name = choose_pool(self.routing, model, ex.route_path, scene)
        if pool_name is None:
            known = ", ".join(sorted(self.routing.models)) or "none"
            return error_reply(
                404,
                f"The model '{model}' does not exist here. Models served: {known}.",
                param="model",
                code="model_not_found",
            )
        self.send_to(ex, pool_name)
        return None

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
            ex.upstream_body = orjson.dumps(ex.payload)
