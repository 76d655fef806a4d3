"""Self-check counts: the memory and the Redis store behave alike (one table of cases)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from extproc.cache.bins import BinStore, MemoryBins, RedisBins, Row
from extproc.dedup.selfcheck import Counts
from tests.topology import SHARED, clean_client


@pytest.fixture(params=["memory", *SHARED])
async def bins(request: pytest.FixtureRequest) -> AsyncIterator[BinStore]:
    if request.param == "memory":
        yield MemoryBins()
        return
    client = await clean_client(request, request.param)
    yield RedisBins(client)
    await client.aclose()


async def test_outcomes_count_per_tenant_language_and_bin(bins: BinStore) -> None:
    assert await bins.counts("acme", "en", "0.80") == Counts()
    assert await bins.record("acme", "en", "0.80", True, "t1") == Counts(1, 1)
    assert await bins.record("acme", "en", "0.80", False, "t2") == Counts(2, 1)
    await bins.record("acme", "zh", "0.80", True, "t3")
    await bins.record("other", "en", "0.90", True, "t4")
    assert await bins.counts("acme", "en", "0.80") == Counts(2, 1)
    assert await bins.counts("acme", "en", "0.90") == Counts()
    assert await bins.rows() == [
        Row("acme", "en", "0.80", Counts(2, 1)),
        Row("acme", "zh", "0.80", Counts(1, 1)),
        Row("other", "en", "0.90", Counts(1, 1)),
    ]


async def test_a_retried_record_counts_once(bins: BinStore) -> None:
    await bins.record("acme", "en", "0.80", False, "same-token")
    assert await bins.record("acme", "en", "0.80", False, "same-token") == Counts(1, 0)
    assert await bins.counts("acme", "en", "0.80") == Counts(1, 0)
