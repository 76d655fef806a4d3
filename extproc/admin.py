"""The gate's admin endpoint (off unless `server.admin_port` is set; bind it to a trusted
network only): purge cached answers and list or lift repeated-prompt blocks, in this process's
stores — the only way to reach the embedded in-process store. With Redis, the CLIs
(`llm-gate cache-purge`, `llm-gate blocks`) do the same for every replica at once.

    POST /admin/cache/purge  {"tenant": T} | {"model": M} | {"key": "<x-gate-cache-key>"}
    GET  /admin/blocks
    POST /admin/blocks/lift  {"caller": C}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web

from .cache.purge import purge_from
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


def admin_app(current: Callable[[], Pipeline]) -> web.Application:
    """`current` returns the live pipeline (a reload swaps it)."""

    async def purge(request: web.Request) -> web.Response:
        body = await _body(request)
        tenant, model, key = body.get("tenant"), body.get("model"), body.get("key")
        if not any(isinstance(v, str) and v for v in (tenant, model, key)):
            raise _error(web.HTTPBadRequest, "name a 'tenant', a 'model' or a 'key' (x-gate-cache-key)")
        purged = await purge_from(_stage(current(), Cache).store, tenant, model, key)
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

    app = web.Application()
    app.add_routes(
        [
            web.post("/admin/cache/purge", purge),
            web.get("/admin/blocks", blocks),
            web.post("/admin/blocks/lift", lift),
        ]
    )
    return app


async def start_admin(current: Callable[[], Pipeline], host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(admin_app(current), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
