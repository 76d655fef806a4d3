"""Screen verdicts shared through the store (`store.redis`): a text one gate process screened
is not embedded again by another, on this replica or any other.

Each process keeps its own memo in front of this; a verdict is read here only on a memo
miss, and written after an embedding, in the background. The key holds the head's
fingerprint, so a new head never reads an old head's scores. The store slow or down: the
text is embedded and scored as if no other process had seen it (the screen never skips a
text for want of the store).
"""

from __future__ import annotations

from ..redis_client import Client
from ..redis_conn import StoreGuard
from ..tasks import Tasks


class SharedVerdicts:
    def __init__(self, client: Client, guard: StoreGuard, tasks: Tasks, prefix: str, ttl_ms: int) -> None:
        self.client = client
        self.guard = guard
        self.tasks = tasks
        self.prefix = prefix  # ends with the head's fingerprint
        self.ttl_ms = ttl_ms

    async def get(self, key: str) -> float | None:
        return await self.guard.run(self._read(key), None, "screen_verdict")

    async def _read(self, key: str) -> float | None:
        raw = await self.client.get(self.prefix + key)
        try:
            return None if raw is None else float(raw)
        except ValueError:  # not a score: embed and score again
            return None

    def put(self, key: str, score: float) -> None:
        self.tasks.spawn(self._put(key, score), "screen_verdict_put")

    async def _put(self, key: str, score: float) -> None:
        # The store's call is made here, not before the task starts: a task cancelled before
        # its first step (at shutdown) would leave that coroutine never awaited.
        await self.guard.run(self._write(key, score), None, "screen_verdict_put")

    async def _write(self, key: str, score: float) -> None:
        await self.client.set(self.prefix + key, repr(float(score)), px=self.ttl_ms)
