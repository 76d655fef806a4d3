"""One JSON log line per request: what an operator needs to follow it, never a key or a prompt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, TextIO

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
    if not log.isEnabledFor(logging.INFO):
        return
    line = orjson.dumps(access_record(ex, busy_s)).decode()
    handlers = log.handlers
    if len(handlers) == 1 and type(handlers[0]) is BatchedLines and not log.propagate:
        # The process's own batch (`batch_access_lines`): no log record to make and hand round.
        handlers[0].add(line, time.time())
    else:
        # A record made directly: `log.info` would walk the stack for a caller nobody logs.
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, line, (), None))


class BatchedLines(logging.Handler):
    """The access lines of one process, written together: one write per `flush_s` (or per
    `max_lines`) instead of one per request, each a system call, and the time stamp formatted
    once a second. Lines look like the process's other log lines (`prefix` after the time).
    A line waits at most `flush_s` (a timer on the event loop that logged it); the rest are
    written when the handler closes (logging's shutdown at exit)."""

    def __init__(self, stream: TextIO, prefix: str, flush_s: float = 0.1, max_lines: int = 256) -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self.prefix = prefix
        self.flush_s = flush_s
        self.max_lines = max_lines
        self._lines: list[str] = []
        self._second = -1
        self._stamp = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.add(record.getMessage(), record.created)

    def add(self, message: str, created: float) -> None:
        """One line, logged at `created` (time.time())."""
        second = int(created)
        if second != self._second:
            self._second, self._stamp = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        self._lines.append(f"{self._stamp},{int((created - second) * 1000):03d} {self.prefix} {message}\n")
        if len(self._lines) >= self.max_lines:
            self.flush()
        elif len(self._lines) == 1:
            try:
                asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:  # no event loop here: nothing would flush it later
                self.flush()

    def flush(self) -> None:
        lines, self._lines = self._lines, []
        if lines:
            with contextlib.suppress(OSError, ValueError):  # a closed stream at exit
                self.stream.write("".join(lines))
                self.stream.flush()

    def close(self) -> None:
        self.flush()
        super().close()


def batch_access_lines(stream: TextIO, prefix: str) -> None:
    """Send the access logger's lines to `stream` in batches, apart from the other logs."""
    handler = BatchedLines(stream, prefix)
    log.addHandler(handler)
    log.propagate = False
