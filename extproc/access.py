"""One JSON log line per request: what an operator needs to follow it, never a key or a prompt."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from .exchange import Exchange

log = logging.getLogger("llm_gate.access")


def access_record(ex: Exchange, busy_s: float, now: float | None = None) -> dict[str, Any]:
    """The request's line: ids, caller, route, decisions and durations (ms)."""
    now = time.perf_counter() if now is None else now
    payload = ex.payload or {}
    model = payload.get("model")
    return {
        "request_id": ex.request_id,
        "tenant": ex.tenant,
        "tier": ex.tier,
        "priority": ex.priority,
        "key_id": ex.key_id,  # a hash: the key itself is never logged
        "method": ex.method,
        "route": ex.route_path,
        "model": model if isinstance(model, str) else None,
        "stream": payload.get("stream") is True,
        "pool": ex.pool,
        "version": ex.version,
        "cluster": ex.client_headers.get("x-gate-cluster"),
        "cache": ex.client_headers.get("x-gate-cache"),
        "screen": ex.client_headers.get("x-gate-screen"),  # flagged | blocked, when the screen judged so
        "decision": ex.decision,
        "status": ex.status,
        "queue_ms": round(ex.waited_s * 1000, 1),
        "gate_ms": round(max(busy_s - ex.waited_s, 0.0) * 1000, 2),
        "total_ms": round((now - ex.started) * 1000, 1),
    }


def log_access(ex: Exchange, busy_s: float) -> None:
    if log.isEnabledFor(logging.INFO):
        # A record made directly: `log.info` would walk the stack for a caller nobody logs.
        line = orjson.dumps(access_record(ex, busy_s)).decode()
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, line, (), None))
