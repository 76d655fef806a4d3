"""Micro-batching across concurrent streams, inference in a worker thread.

Each ``embed(text)`` call queues its text and awaits a future. One collector task per event
loop takes what is queued: everything that arrived while the previous batch ran, plus whatever
arrives within ``window_s`` when it found a single text. The batch runs in a worker thread
(ONNX Runtime releases the GIL), so the event loop keeps serving other streams meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .encoder import Embedder


@dataclass(frozen=True)
class BatchReport:
    size: int
    infer_s: float  # wall time of embed_sync in the worker thread
    queue_waits: tuple[float, ...]  # per text: enqueue -> start of its batch


@dataclass
class BatchStats:
    batches: int = 0
    texts: int = 0
    errors: int = 0
    max_size: int = 0
    infer_s_total: float = 0.0
    infer_s_max: float = 0.0
    queue_wait_s_total: float = 0.0
    last: BatchReport | None = None
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> count

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        self.texts += report.size
        self.max_size = max(self.max_size, report.size)
        self.infer_s_total += report.infer_s
        self.infer_s_max = max(self.infer_s_max, report.infer_s)
        self.queue_wait_s_total += sum(report.queue_waits)
        self.sizes[report.size] = self.sizes.get(report.size, 0) + 1
        self.last = report


@dataclass
class _Item:
    text: str
    future: asyncio.Future[np.ndarray]
    queued: float


class BatchingEmbedder:
    def __init__(
        self,
        inner: Embedder,
        *,
        max_batch: int = 32,
        window_s: float = 0.001,
        workers: int = 1,
        on_batch: Callable[[BatchReport], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.max_batch = max_batch
        self.window_s = window_s
        self.stats = BatchStats()
        self._on_batch = on_batch
        self._clock = clock
        self._workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"embed-{inner.name}")
        self._queue: asyncio.Queue[_Item] | None = None
        self._collector: asyncio.Task[None] | None = None
        self._running: set[asyncio.Future[None]] = set()
        self._slots: asyncio.Semaphore | None = None

    def can_read(self, text: str) -> bool:
        return self.inner.can_read(text)

    async def embed(self, text: str) -> np.ndarray:
        queue = self._ensure_started()
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        queue.put_nowait(_Item(text, future, self._clock()))
        return await future

    async def warmup(
        self, texts: tuple[str, ...] = ("warm up", "a somewhat longer sentence to warm up the model")
    ) -> None:
        """Run the model once per shape class before the health check says SERVING."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.inner.embed_sync, [texts[0]])
        await loop.run_in_executor(self._executor, self.inner.embed_sync, list(texts))

    async def aclose(self) -> None:
        if self._collector is not None:
            self._collector.cancel()
            await asyncio.gather(self._collector, return_exceptions=True)
            self._collector = None
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        self._queue = None
        self._executor.shutdown(wait=False)

    def _ensure_started(self) -> asyncio.Queue[_Item]:
        if self._collector is None or self._collector.done() or self._queue is None:
            self._queue = asyncio.Queue()
            self._slots = asyncio.Semaphore(self._workers)
            self._collector = asyncio.get_running_loop().create_task(self._collect(self._queue))
        return self._queue

    async def _collect(self, queue: asyncio.Queue[_Item]) -> None:
        assert self._slots is not None
        while True:
            await self._slots.acquire()  # a batch forms while the previous one runs
            batch = [await queue.get()]
            self._drain(queue, batch)
            if len(batch) == 1 and self.window_s > 0:
                await asyncio.sleep(self.window_s)
                self._drain(queue, batch)
            live = [item for item in batch if not item.future.done()]
            if not live:
                self._slots.release()
                continue
            task = asyncio.ensure_future(self._run(live))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _drain(self, queue: asyncio.Queue[_Item], batch: list[_Item]) -> None:
        while len(batch) < self.max_batch and not queue.empty():
            batch.append(queue.get_nowait())

    async def _run(self, batch: list[_Item]) -> None:
        assert self._slots is not None
        start = self._clock()
        try:
            loop = asyncio.get_running_loop()
            vectors = await loop.run_in_executor(
                self._executor, self.inner.embed_sync, [i.text for i in batch]
            )
        except Exception as exc:
            self.stats.errors += 1
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        finally:
            self._slots.release()
        report = BatchReport(len(batch), self._clock() - start, tuple(start - i.queued for i in batch))
        self.stats.add(report)
        if self._on_batch is not None:
            self._on_batch(report)
        for item, vector in zip(batch, vectors, strict=True):
            if not item.future.done():
                item.future.set_result(vector)
