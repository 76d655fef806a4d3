"""The gate's admin endpoint (off unless `server.admin_port` is set): purge cached answers and
list or lift repeated-prompt blocks, in this process's stores — the only way to reach the
embedded in-process store. With Redis, the CLIs
(`llm-gate cache-purge`, `llm-gate blocks`) do the same for every replica at once.

    POST /admin/cache/purge  {"tenant": T} | {"model": M} | {"key": "<x-gate-cache-key>"}
    GET  /admin/blocks
    POST /admin/blocks/lift  {"caller": C}

It listens on its own address, `server.admin_host` (default 127.0.0.1), not on the gRPC
port's `server.host`. With a token (`server.admin_token_file`, or the environment variable
named by `server.admin_token_env`, LLM_GATE_ADMIN_TOKEN by default) every call must carry
`authorization: Bearer TOKEN`; off loopback the endpoint refuses to start without one.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from .cache.purge import purge_from
from .config import Server
from .pipeline import Pipeline
from .stages.cache import Cache
from .stages.ratelimit import RateLimit

S = TypeVar("S")


def _stage(pipeline: Pipeline, kind: type[S]) -> S:
    for stage in pipeline.stages:
        if isinstance(stage, kind):
            return stage
    raise _error(web.HTTPNotFound, f"this gate has no {kind.__name__} stage")


def _error(kind: type[web.HTTPError], message: str) -> web.HTTPError:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error"}}).decode()
    return kind(text=body, content_type="application/json")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        raise _error(web.HTTPBadRequest, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise _error(web.HTTPBadRequest, "the body must be a JSON object")
    return body


LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminConfigError(RuntimeError):
    pass


def admin_token(server: Server) -> str | None:
    """The token from `admin_token_file`, else from the `admin_token_env` variable; None: none."""
    if server.admin_token_file is not None:
        token = server.admin_token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise AdminConfigError(f"server.admin_token_file {server.admin_token_file} is empty")
        return token
    return os.environ.get(server.admin_token_env, "").strip() or None


def _require(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise _error(web.HTTPUnauthorized, "send authorization: Bearer <admin token>")
        return await handler(request)

    return check


def admin_app(current: Callable[[], Pipeline], token: str | None = None) -> web.Application:
    """`current` returns the live pipeline (a reload swaps it); `token`: required bearer token."""

    async def purge(request: web.Request) -> web.Response:
        body = await _body(request)
        tenant, model, key = body.get("tenant"), body.get("model"), body.get("key")
        if not any(isinstance(v, str) and v for v in (tenant, model, key)):
            raise _error(web.HTTPBadRequest, "name a 'tenant', a 'model' or a 'key' (x-gate-cache-key)")
        purged = await purge_from(_stage(current(), Cache).b.store, tenant, model, key)
        return web.json_response({"purged": purged})

    async def blocks(request: web.Request) -> web.Response:
        found = await _stage(current(), RateLimit).store.blocks()
        rows = [{"caller": b.caller, "seconds_left": round(b.left / 1e6, 3), "info": b.info} for b in found]
        return web.json_response({"blocks": rows})

    async def lift(request: web.Request) -> web.Response:
        caller = (await _body(request)).get("caller")
        if not isinstance(caller, str) or not caller:
            raise _error(web.HTTPBadRequest, "name the 'caller' to lift, as GET /admin/blocks lists it")
        return web.json_response({"lifted": await _stage(current(), RateLimit).store.lift(caller)})

    app = web.Application(middlewares=[_require(token)] if token else [])
    app.add_routes(
        [
            web.post("/admin/cache/purge", purge),
            web.get("/admin/blocks", blocks),
            web.post("/admin/blocks/lift", lift),
        ]
    )
    return app


async def start_admin(current: Callable[[], Pipeline], server: Server, index: int = 0) -> web.AppRunner:
    """Worker `index`'s admin endpoint on `server.admin_host`, port `server.admin_port + index`."""
    assert server.admin_port is not None
    token = admin_token(server)
    if token is None and server.admin_host not in LOOPBACK:
        raise AdminConfigError(
            f"server.admin_host {server.admin_host} is not loopback: set server.admin_token_file "
            f"or {server.admin_token_env}"
        )
    runner = web.AppRunner(admin_app(current, token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, server.admin_host, server.admin_port + index).start()
    return runner
