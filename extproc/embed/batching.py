"""Micro-batching across concurrent streams, inference in worker threads that never wait for the loop.

Each ``embed(text)`` call queues its text and awaits a future. ``workers`` threads each take
what is queued (up to ``max_batch``; when a thread finds a single text while texts arrive close
together, it waits ``window_s`` for company), run the model (ONNX Runtime releases the GIL),
hand the whole batch back to the event loop in one callback, and take the next batch at once:
a thread does not wait for the loop to dispatch the previous results, and with two or more
workers the next batch forms and runs while the previous one is still running.

Shedding. ``timeout_s`` is the caller's budget; the embedder gives up at ``GIVE_UP`` of it, so
that its own shed, not the caller's time box of the same length, ends the wait and says why.
The queue is bounded: a text that finds ``max_queue`` texts waiting, or whose wait (texts ahead
at the measured throughput) would already pass the budget, raises ``EmbedShedError`` at once,
so the caller takes the exact path now instead of after the time-out. A worker forming a batch
sheds the texts it could no longer finish in time (no model time spent on an answer nobody
waits for), and a text still unanswered at the budget is dropped from the queue. Every shed
raises ``EmbedShedError`` and is counted (``stats.shed`` by reason, and ``on_shed`` for metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .encoder import Embedder
from .token_states import TokenStates, TokenStatesCache

SHED_REASONS = ("queue_full", "late", "timeout")
GIVE_UP = 0.9  # of the caller's budget: the embedder's shed comes first, with its reason
# A lone text waits `window_s` for company only when the text before it came at most this many
# windows earlier: at one request at a time the wait would only add to every embedding.
COMPANY_GAPS = 2.0


class EmbedShedError(Exception):
    """An embedding not computed because it could not arrive in time; take the exact path."""

    def __init__(self, reason: str, wait_s: float = 0.0) -> None:
        super().__init__(f"embedding shed ({reason}, estimated wait {wait_s * 1000:.0f} ms)")
        self.reason = reason
        self.wait_s = wait_s


def name_native_thread(name: str) -> None:
    """Give the running thread its name in the OS too (Linux: 15 bytes), so ``top -H`` and a
    benchmark reading /proc see the embedding threads apart from the event loop."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def quota_cores(cpu_max: str | None, cfs_quota_us: str | None, cfs_period_us: str | None) -> int | None:
    """The CPUs a cgroup's quota allows, rounded up (a pod's `resources.limits.cpu`): from
    cgroup v2's `cpu.max` ("200000 100000", or "max 100000" for none) or v1's quota and
    period; None when there is no quota."""
    quota = period = None
    if cpu_max is not None:
        parts = cpu_max.split()
        if len(parts) == 2 and parts[0] != "max":
            quota, period = parts
    elif cfs_quota_us is not None and cfs_period_us is not None:
        quota, period = cfs_quota_us.strip(), cfs_period_us.strip()
    try:
        q, p = int(quota or -1), int(period or 0)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return max(1, -(-q // p))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota (in
    a container the node's cores are not the pod's)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
    quota = quota_cores(
        _read("/sys/fs/cgroup/cpu.max"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
    return min(cores, quota) if quota is not None else cores


def default_workers(cores: int | None = None) -> int:
    """Batches in flight: two once there are two cores (one forms while the other runs)."""
    return 1 if (cores or available_cores()) < 2 else 2


def default_threads(cores: int | None = None, processes: int = 1, workers: int | None = None) -> int:
    """Intra-op threads per inference: the cores shared out among gate processes and workers."""
    cores = cores or available_cores()
    return max(1, cores // max(1, processes * (workers or default_workers(cores))))


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
    windows: int = 0  # times a lone text waited `window_s` for company
    infer_s_total: float = 0.0
    infer_s_max: float = 0.0
    queue_wait_s_total: float = 0.0
    last: BatchReport | None = None
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> count
    shed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SHED_REASONS, 0))

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        self.texts += report.size
        self.max_size = max(self.max_size, report.size)
        self.infer_s_total += report.infer_s
        self.infer_s_max = max(self.infer_s_max, report.infer_s)
        self.queue_wait_s_total += sum(report.queue_waits)
        self.sizes[report.size] = self.sizes.get(report.size, 0) + 1
        self.last = report


@dataclass(eq=False)
class _Item:
    text: str
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    queued: float
    deadline: float | None  # when the embedder gives up on it
    meanwhile: Callable[[], object] | None = None  # the caller's work while the model runs
    abandoned: bool = False  # set on the loop when the caller left; the workers skip it


def estimated_wait(ahead: int, running: int, workers: int, per_text_s: float | None) -> float:
    """Seconds before a new text's batch finishes: what is ahead of it, shared among the workers."""
    if per_text_s is None:
        return 0.0
    return (ahead + running + 1) * per_text_s / max(1, workers)


class BatchingEmbedder:
    def __init__(
        self,
        inner: Embedder,
        *,
        max_batch: int = 32,
        window_s: float = 0.001,
        workers: int | None = None,
        max_queue: int = 256,
        timeout_s: float | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_shed: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        states_bytes: int = 64 << 20,
        backlog: int | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.max_batch = max_batch
        self.window_s = window_s
        self.workers = workers or default_workers()
        self.max_queue = max_queue
        # Texts waiting before a second batch runs beside the first: below it they wait for the
        # running batch to end and go together (a batch of 1-2 costs up to twice as much per text).
        self.backlog = backlog if backlog is not None else max(2, max_batch // 4)
        self.timeout_s = timeout_s
        self._budget_s = None if timeout_s is None else timeout_s * GIVE_UP
        self.stats = BatchStats()
        self._on_batch = on_batch
        self._on_shed = on_shed
        self._clock = clock
        self._pending: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._running = 0  # texts in batches being computed
        self._per_text_s: float | None = None  # EWMA of one worker's inference time per text
        self._last_at = -math.inf  # when the last text arrived
        self._gap_s = math.inf  # between the last two texts
        self._closed = False
        # Token states of what was embedded, from the same forward pass (the dedup verifier's).
        read = getattr(inner, "embed_with_states", None) if getattr(inner, "reads_states", False) else None
        self._read: Callable[[list[str]], tuple[np.ndarray, list[TokenStates]]] | None = (
            read if states_bytes > 0 else None
        )
        self.states = TokenStatesCache(states_bytes) if self._read is not None else None

    def can_read(self, text: str) -> bool:
        return self.inner.can_read(text)

    @property
    def queued(self) -> int:
        return len(self._pending)

    async def embed(self, text: str, meanwhile: Callable[[], object] | None = None) -> np.ndarray:
        """The text's vector. ``meanwhile``: the caller's work for its event loop while the model
        runs (the loop would wait idle otherwise), called on the loop once a worker has started
        the text's batch: called before, it would hold the interpreter's lock that the worker
        needs to start, and run first instead of beside."""
        loop = asyncio.get_running_loop()
        now, budget = self._clock(), self._budget_s
        deadline = None if budget is None else now + budget
        item = _Item(text, loop.create_future(), loop, now, deadline, meanwhile)
        with self._cond:
            ahead = len(self._pending)
            wait = estimated_wait(ahead, self._running, self.workers, self._per_text_s)
            if ahead >= self.max_queue:
                raise self._shed("queue_full", wait)
            if budget is not None and wait > budget:
                raise self._shed("late", wait)
            self._pending.append(item)
            self._gap_s, self._last_at = now - self._last_at, now
            self._cond.notify()
        self._ensure_started()
        try:
            if budget is None:
                return await item.future
            async with asyncio.timeout(budget):
                return await item.future
        except TimeoutError:
            raise self._shed("timeout", budget or 0.0) from None
        except asyncio.CancelledError:
            if self.timeout_s is not None and self._clock() - item.queued >= 0.9 * self.timeout_s:
                self._shed("timeout", self.timeout_s)  # the caller's own time box of the same length
            raise
        finally:
            if not item.future.done() or item.future.cancelled():
                item.abandoned = True  # cancelled or timed out: not worth computing
                item.future.cancel()

    def _late(self, item: _Item, wait_s: float) -> None:
        """On the loop: a text a worker dropped because its answer would come too late."""
        if not item.future.done():
            item.future.set_exception(self._shed("late", wait_s))

    def _shed(self, reason: str, wait_s: float) -> EmbedShedError:
        self.stats.shed[reason] = self.stats.shed.get(reason, 0) + 1
        if self._on_shed is not None:
            self._on_shed(reason)
        return EmbedShedError(reason, wait_s)

    async def warmup(
        self, texts: tuple[str, ...] = ("warm up", "a somewhat longer sentence to warm up the model")
    ) -> None:
        """Run the model once per shape class before the health check says SERVING."""
        await asyncio.to_thread(self.inner.embed_sync, [texts[0]])
        await asyncio.to_thread(self.inner.embed_sync, list(texts))

    async def aclose(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        threads, self._threads = self._threads, []
        for t in threads:
            await asyncio.to_thread(t.join, 5.0)
        for item in self._pending:
            if not item.future.done():
                item.loop.call_soon_threadsafe(_cancel, item.future)
        self._pending.clear()

    # -- worker threads ------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if len(self._threads) >= self.workers or self._closed:
            return
        with self._cond:
            while len(self._threads) < self.workers:
                t = threading.Thread(
                    target=self._work, name=f"embed-{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
                t.start()

    def _take(self) -> list[_Item] | None:
        """The next batch (None when closing); waits for work, and `window_s` for company."""
        with self._cond:
            while not self._closed:
                if self._running and len(self._pending) < self.backlog:
                    self._cond.wait()  # another batch runs: let this one grow meanwhile
                    continue
                batch = self._drain([])
                if len(batch) == 1 and self._running == 0 and 0 < self._gap_s <= COMPANY_GAPS * self.window_s:
                    self.stats.windows += 1
                    self._cond.wait(self.window_s)
                    batch = self._drain(batch)
                batch = self._drop_late(batch)
                if batch:
                    self._running += len(batch)
                    return batch
                if not self._pending:
                    self._cond.wait()
            return None

    def _drop_late(self, batch: list[_Item]) -> list[_Item]:
        """The batch without the texts it would finish after their deadline (shed on their loop)."""
        if self._per_text_s is None or self._budget_s is None:
            return batch
        done_at = self._clock() + self._per_text_s * len(batch)
        kept: list[_Item] = []
        for item in batch:
            if item.deadline is not None and done_at > item.deadline:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    item.loop.call_soon_threadsafe(self._late, item, done_at - item.queued)
            else:
                kept.append(item)
        return kept

    def _drain(self, batch: list[_Item]) -> list[_Item]:
        while len(batch) < self.max_batch and self._pending:
            item = self._pending.popleft()
            if not item.abandoned:
                batch.append(item)
        return batch

    def _work(self) -> None:
        name_native_thread(threading.current_thread().name)
        while (batch := self._take()) is not None:
            for item in batch:
                if item.meanwhile is not None:
                    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                        item.loop.call_soon_threadsafe(item.meanwhile)
            start = self._clock()
            vectors: np.ndarray | None = None
            states: list[TokenStates] | None = None
            error: BaseException | None = None
            try:
                if self._read is not None:
                    vectors, states = self._read([i.text for i in batch])
                else:
                    vectors = self.inner.embed_sync([i.text for i in batch])
            except Exception as exc:
                error = exc
            infer_s = self._clock() - start
            with self._cond:
                self._running -= len(batch)
                if error is None:
                    per_text = infer_s / len(batch)
                    old = self._per_text_s
                    self._per_text_s = per_text if old is None else old + 0.2 * (per_text - old)
            report = BatchReport(len(batch), infer_s, tuple(start - i.queued for i in batch))
            by_loop: dict[asyncio.AbstractEventLoop, list[int]] = {}
            for n, item in enumerate(batch):
                by_loop.setdefault(item.loop, []).append(n)
            first = True
            for loop, rows in by_loop.items():
                mine = [batch[n] for n in rows]
                part = None if vectors is None else vectors[rows]
                held = None if states is None else [states[n] for n in rows]
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits for these
                    loop.call_soon_threadsafe(
                        self._deliver, mine, part, held, error, report if first else None
                    )
                first = False

    def _deliver(
        self,
        items: list[_Item],
        vectors: np.ndarray | None,
        states: list[TokenStates] | None,
        error: BaseException | None,
        report: BatchReport | None,
    ) -> None:
        """On the loop: one callback per batch keeps the token states and hands every caller its row."""
        if report is not None:
            if error is None:
                self.stats.add(report)
                if self._on_batch is not None:
                    self._on_batch(report)
            else:
                self.stats.errors += 1
        if states is not None and self.states is not None:
            for item, st in zip(items, states, strict=True):
                self.states.put(item.text, st)
        for n, item in enumerate(items):
            if item.future.done():
                continue
            if error is not None:
                item.future.set_exception(error)
            else:
                assert vectors is not None
                item.future.set_result(vectors[n])


def _cancel(future: asyncio.Future[np.ndarray]) -> None:
    if not future.done():
        future.cancel()
