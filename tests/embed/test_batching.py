from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from extproc.embed import BatchingEmbedder, BatchReport, OnnxEmbedder
from extproc.embed.batching import GIVE_UP, EmbedShedError, default_threads, default_workers, quota_cores

from .sentences import MIXED


class Slow:
    """A fake embedder: fixed cost per batch, records batch sizes and the thread it ran on."""

    name = "slow"
    dim = 4

    def __init__(self, seconds: float = 0.01, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail
        self.sizes: list[int] = []
        self.seen: list[str] = []
        self.threads: set[int] = set()

    def can_read(self, text: str) -> bool:
        return bool(text)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        self.sizes.append(len(texts))
        self.seen.extend(texts)
        self.threads.add(threading.get_ident())
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("model broke")
        out = np.zeros((len(texts), 4), dtype=np.float32)
        out[:, 0] = [len(t) for t in texts]
        return out


async def test_concurrent_calls_are_batched_off_the_loop() -> None:
    inner = Slow()
    reports: list[BatchReport] = []
    emb = BatchingEmbedder(inner, max_batch=8, on_batch=reports.append)
    try:
        results = await asyncio.gather(*(emb.embed("x" * i) for i in range(1, 21)))
    finally:
        await emb.aclose()
    assert [int(r[0]) for r in results] == list(range(1, 21))  # each caller gets its own row
    assert max(inner.sizes) > 1 and max(inner.sizes) <= 8
    assert threading.get_ident() not in inner.threads
    assert emb.stats.texts == 20 and emb.stats.max_size == max(inner.sizes)
    assert sum(r.size for r in reports) == 20 and all(len(r.queue_waits) == r.size for r in reports)


async def test_errors_reach_every_waiter_and_the_next_batch_works() -> None:
    inner = Slow(fail=True)
    emb = BatchingEmbedder(inner)
    try:
        outcomes = await asyncio.gather(emb.embed("a"), emb.embed("b"), return_exceptions=True)
        assert all(isinstance(o, RuntimeError) for o in outcomes)
        inner.fail = False
        assert (await emb.embed("abc"))[0] == 3
    finally:
        await emb.aclose()
    assert emb.stats.errors >= 1


async def test_cancelled_caller_does_not_break_the_batch() -> None:
    inner = Slow(0.05)
    emb = BatchingEmbedder(inner, workers=1)
    try:
        first = asyncio.ensure_future(emb.embed("first"))
        await asyncio.sleep(0.01)  # first batch running
        doomed = asyncio.ensure_future(emb.embed("doomed"))
        kept = asyncio.ensure_future(emb.embed("kept"))
        await asyncio.sleep(0)
        doomed.cancel()
        assert (await kept)[0] == 4 and (await first)[0] == 5
    finally:
        await emb.aclose()
    assert "doomed" not in inner.seen and "kept" in inner.seen


class ThreadNoting:
    """The real model, noting which thread runs each batch."""

    def __init__(self, inner: OnnxEmbedder) -> None:
        self.inner = inner
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        self.threads.add(threading.get_ident())
        return self.inner.embed_sync(texts)


@pytest.mark.parametrize("name", ["e5", "minilm"])
async def test_real_model_batches_off_the_event_loop(name: str, request: pytest.FixtureRequest) -> None:
    """Batches run in worker threads: the loop keeps serving other streams meanwhile (how much
    that buys is a benchmark figure, `load.bench_gate`, not an assertion here)."""
    inner: OnnxEmbedder = request.getfixturevalue(name)
    noting = ThreadNoting(inner)
    emb = BatchingEmbedder(noting, max_batch=16, workers=1)  # type: ignore[arg-type]
    await emb.warmup()
    try:
        texts = [f"{t} #{i}" for i in range(4) for t in MIXED]
        vectors = await asyncio.gather(*(emb.embed(t) for t in texts))
    finally:
        await emb.aclose()
    assert emb.stats.max_size > 1
    ref = inner.embed_sync(texts)
    assert np.abs(np.stack(vectors) - ref).max() < 1e-5
    assert noting.threads and threading.get_ident() not in noting.threads


class Gauge(Slow):
    """Slow, and records how many batches ran at once."""

    def __init__(self, seconds: float = 0.05) -> None:
        super().__init__(seconds)
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().embed_sync(texts)
        finally:
            with self._lock:
                self.now -= 1


async def test_two_workers_run_two_batches_at_once() -> None:
    inner = Gauge(0.05)
    emb = BatchingEmbedder(inner, max_batch=4, workers=2)
    try:
        results = await asyncio.gather(*(emb.embed("x" * i) for i in range(1, 17)))
    finally:
        await emb.aclose()
    assert [int(r[0]) for r in results] == list(range(1, 17))
    assert inner.most == 2 and len(inner.threads) == 2


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


async def test_the_next_batch_runs_while_the_loop_is_busy() -> None:
    inner = Slow(0.02)
    emb = BatchingEmbedder(inner, max_batch=2, workers=1, window_s=0)
    try:
        tasks = [asyncio.ensure_future(emb.embed(t)) for t in ("a", "bb", "ccc", "dddd", "eeeee", "ffffff")]
        await asyncio.sleep(0)  # all six queued
        hold_the_loop(0.5)  # the loop is stuck in some other stream's work
        assert sum(inner.sizes) == 6 and len(inner.sizes) >= 3  # every batch ran meanwhile
        assert [int(r[0]) for r in await asyncio.gather(*tasks)] == [1, 2, 3, 4, 5, 6]
    finally:
        await emb.aclose()


async def test_the_callers_own_work_runs_while_its_text_is_embedded() -> None:
    """`meanwhile` runs on the caller's loop once its text's batch has started: beside the model."""
    inner = Slow(0.2)
    emb = BatchingEmbedder(inner, max_batch=2, workers=1, window_s=0)
    seen: list[int] = []
    try:
        vector = await emb.embed("abc", lambda: (hold_the_loop(0.2), seen.append(len(inner.sizes))))
    finally:
        await emb.aclose()
    assert int(vector[0]) == 3 and seen == [1]  # its batch was running when the caller's work ended


async def test_a_full_queue_sheds_at_once_and_counts_it() -> None:
    inner = Slow(0.3)
    sheds: list[str] = []
    emb = BatchingEmbedder(inner, max_batch=1, workers=1, max_queue=2, window_s=0, on_shed=sheds.append)
    try:
        running = asyncio.ensure_future(emb.embed("run"))
        await asyncio.sleep(0.05)  # in the model now
        queued = [asyncio.ensure_future(emb.embed(t)) for t in ("q1", "q2")]
        await asyncio.sleep(0)
        with pytest.raises(EmbedShedError) as info:
            await emb.embed("one too many")
        assert info.value.reason == "queue_full"
        assert not running.done()  # told before anything it waited on finished
        await asyncio.gather(running, *queued)
    finally:
        await emb.aclose()
    assert sheds == ["queue_full"] and emb.stats.shed["queue_full"] == 1
    assert "one too many" not in inner.seen


async def test_a_text_that_would_arrive_late_is_shed_at_once() -> None:
    inner = Slow(0.1)
    emb = BatchingEmbedder(inner, max_batch=1, workers=1, window_s=0, timeout_s=0.32)
    try:
        await emb.embed("measure")  # 0.1 s a text
        first = [asyncio.ensure_future(emb.embed(f"t{i}")) for i in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(EmbedShedError) as info:
            await emb.embed("third in line")  # ~0.3 s of work ahead of it, 0.288 s allowed
        assert info.value.reason == "late" and info.value.wait_s > 0.32 * GIVE_UP
        await asyncio.gather(*first)
    finally:
        await emb.aclose()
    assert emb.stats.shed["late"] == 1 and "third in line" not in inner.seen


async def test_a_time_out_is_a_counted_shed_and_the_text_is_not_computed_later() -> None:
    inner = Slow(0.3)
    emb = BatchingEmbedder(inner, max_batch=1, workers=1, window_s=0, timeout_s=0.1)
    try:
        blocker = asyncio.ensure_future(emb.embed("blocker"))
        await asyncio.sleep(0.01)
        with pytest.raises(EmbedShedError) as info:
            await emb.embed("waits too long")  # nothing measured yet: queued, then timed out
        assert info.value.reason == "timeout"
        with pytest.raises(EmbedShedError):
            await blocker  # its own 0.1 s passed too
        await asyncio.sleep(0.4)
    finally:
        await emb.aclose()
    assert emb.stats.shed["timeout"] == 2
    assert inner.seen == ["blocker"]


async def test_a_text_a_worker_would_finish_too_late_is_shed_not_computed() -> None:
    inner = Slow(0.01)
    emb = BatchingEmbedder(inner, max_batch=1, workers=1, window_s=0, timeout_s=0.25)
    try:
        await emb.embed("measure")  # fast so far: what comes next is let in
        inner.seconds = 0.2  # the model slows down (a busy machine)
        slow = asyncio.ensure_future(emb.embed("slow"))
        await asyncio.sleep(0)
        with pytest.raises(EmbedShedError) as info:
            await emb.embed("behind it")  # waited 0.2 s, another 0.05 s or more would pass its budget
        assert info.value.reason == "late"
        await slow
    finally:
        await emb.aclose()
    assert emb.stats.shed == {"queue_full": 0, "late": 1, "timeout": 0}
    assert "behind it" not in inner.seen


async def test_a_caller_boxed_by_the_same_time_out_hears_the_shed_first() -> None:
    """The cache stage waits on ``embed`` within its own box of the embedder's time-out: what
    ends the wait must be the counted shed with its reason, not the caller's bare time-out."""
    inner = Slow(2.0)
    emb = BatchingEmbedder(inner, max_batch=1, workers=1, window_s=0, timeout_s=1.0)
    try:
        blocker = asyncio.ensure_future(emb.embed("blocker"))
        await asyncio.sleep(0.01)
        with pytest.raises(EmbedShedError) as info:
            async with asyncio.timeout(1.0):
                await emb.embed("waits")
        assert info.value.reason == "timeout"
        with pytest.raises(EmbedShedError):
            await blocker
    finally:
        await emb.aclose()
    assert emb.stats.shed["timeout"] == 2


class Announcing(Slow):
    """Slow, and says when each batch starts."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.starts = threading.Semaphore(0)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        self.starts.release()
        return super().embed_sync(texts)

    async def started(self) -> None:
        await asyncio.to_thread(self.starts.acquire)


async def test_texts_wait_for_the_running_batch_unless_a_backlog_builds() -> None:
    """A second worker runs beside the first only for a backlog: a few texts that arrive while a
    batch runs go together after it, not one or two at a time beside it."""
    inner = Announcing(0.1)
    emb = BatchingEmbedder(inner, max_batch=8, workers=2, window_s=0, backlog=3)
    try:
        first = asyncio.ensure_future(emb.embed("a"))
        await inner.started()
        b = asyncio.ensure_future(emb.embed("b"))
        await asyncio.sleep(0.02)  # the idle worker could take b alone now
        await asyncio.gather(first, b, emb.embed("c"))
        assert inner.sizes == [1, 2]  # b and c waited for a's batch to end
        await inner.started()
        running = asyncio.ensure_future(emb.embed("d"))
        await inner.started()
        backlog = [asyncio.ensure_future(emb.embed(t)) for t in ("e", "f", "g")]
        await inner.started()
        assert not running.done()  # e, f, g run beside d
        await asyncio.gather(running, *backlog)
    finally:
        await emb.aclose()
    assert inner.sizes == [1, 2, 1, 3] and len(inner.threads) == 2


def test_defaults_share_the_cores() -> None:
    assert default_workers(1) == 1 and default_workers(2) == 2 and default_workers(16) == 2
    assert default_threads(16) == 8 and default_threads(16, processes=4) == 2
    assert default_threads(2) == 1 and default_threads(1) == 1


@pytest.mark.parametrize("name", ["e5", "minilm"])
async def test_batches_keep_each_texts_token_states_from_the_same_run(
    name: str, request: pytest.FixtureRequest
) -> None:
    inner: OnnxEmbedder = request.getfixturevalue(name)
    emb = BatchingEmbedder(inner, max_batch=16, workers=1)
    try:
        texts = [f"{t} #{i}" for i in range(2) for t in MIXED]
        vectors = await asyncio.gather(*(emb.embed(t) for t in texts))
    finally:
        await emb.aclose()
    assert emb.states is not None and emb.stats.texts == len(texts) and emb.stats.max_size > 1
    ref_vectors, ref_states = inner.embed_with_states(texts)
    assert np.abs(np.stack(vectors) - ref_vectors).max() < 1e-5
    for text, ref in zip(texts, ref_states, strict=True):
        got = emb.states.get(text)
        assert got is not None and got.pieces == ref.pieces
        assert np.abs(got.vectors - ref.vectors).max() < 1e-4


def test_an_embedder_without_token_states_keeps_none() -> None:
    assert BatchingEmbedder(Slow()).states is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cpu_max", "v1_quota", "v1_period", "cores"),
    [
        ("200000 100000\n", None, None, 2),  # limits.cpu: 2
        ("150000 100000", None, None, 2),  # 1.5 rounds up
        ("50000 100000", None, None, 1),
        ("max 100000", None, None, None),  # no limit
        (None, "-1", "100000", None),
        (None, "400000\n", "100000\n", 4),
        (None, None, None, None),
        ("garbage", None, None, None),
    ],
)
def test_the_cgroup_quota_caps_the_cores(
    cpu_max: str | None, v1_quota: str | None, v1_period: str | None, cores: int | None
) -> None:
    assert quota_cores(cpu_max, v1_quota, v1_period) == cores


async def test_a_lone_text_waits_for_company_only_while_texts_arrive_close_together() -> None:
    inner = Slow(seconds=0.002)
    emb = BatchingEmbedder(inner, max_batch=8, window_s=0.05, workers=1)
    try:
        for i in range(4):  # one request at a time, well apart: no text waits for another
            await emb.embed(f"alone {i}")
            await asyncio.sleep(0.3)
        assert emb.stats.windows == 0
        for i in range(3):  # back to back: each next text comes within a few ms
            await emb.embed(f"close {i}")
    finally:
        await emb.aclose()
    assert emb.stats.windows >= 2
