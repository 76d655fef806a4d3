"""Process-wide services for tests that build one stage at a time."""

from __future__ import annotations

from typing import Any

from extproc.config import Store
from extproc.metrics import Metrics
from extproc.redis_client import Client
from extproc.redis_conn import StoreGuard
from extproc.tasks import Tasks


def guard(metrics: Metrics | None = None, client: Client | None = None, **store: Any) -> StoreGuard:
    """The store guard a stage gets from the process (`client` only matters for its probe)."""
    metrics = metrics or Metrics()
    return StoreGuard(client, Store(**store), metrics, Tasks(metrics))
