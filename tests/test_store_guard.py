"""A store call that fails with something other than Redis's own errors (redis-py has raised
IndexError and AttributeError on a connection cut mid-call) is a failed call like any other:
the caller gets its default and the request goes on, instead of the stage failing with it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from extproc.metrics import Metrics
from tests.services import guard


async def broken_client_call() -> str:
    await asyncio.sleep(0)
    raise IndexError("tuple index out of range")


async def test_an_unexpected_error_from_a_store_call_is_a_counted_failure_not_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    store = guard(metrics, None, down_after=2)
    with caplog.at_level(logging.ERROR, logger="llm_gate"):
        for _ in range(3):
            assert await store.run(broken_client_call(), "default", "cache_lookup") == "default"
    assert metrics.store_errors.labels("cache_lookup", "IndexError")._value.get() == 3
    assert store.up  # the store answered nothing wrong: it is not marked down
    assert "store call cache_lookup raised IndexError" in caplog.text  # with its trace, for the bug


async def test_a_cancellation_still_goes_through() -> None:
    store = guard(Metrics(), None)
    task = asyncio.ensure_future(store.run(asyncio.sleep(10), None, "cache_lookup"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
