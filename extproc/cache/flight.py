"""What the cache stage knows about one request, and wake-ups for followers.

Followers of a leader in another process re-check the store with a growing delay; the
store's notice that the answer landed wakes them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import numpy as np

from .entry import Capture
from .keys import Question
from .rules import Access


@dataclass
class Flight:
    q: Question
    key: str
    access: Access
    stream: bool
    include_usage: bool
    token: str | None = None  # the lease this request holds while it leads
    vector: np.ndarray | None = None
    bands: tuple[str, ...] = ()
    capture: Capture | None = None
    served: bool = False  # answered from the cache (or by a leader)


class Wakeups:
    """Per-key events that followers of a leader elsewhere wait on (set by the store's notice);
    removed when the last waiter leaves."""

    def __init__(self) -> None:
        self._events: dict[str, tuple[asyncio.Event, int]] = {}

    async def wait(self, slot: str, seconds: float) -> bool:
        event, count = self._events.get(slot, (asyncio.Event(), 0))
        self._events[slot] = (event, count + 1)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await event.wait()
            return event.is_set()
        finally:
            held = self._events.get(slot)
            if held is not None and held[0] is event:
                if held[1] <= 1:
                    del self._events[slot]
                else:
                    self._events[slot] = (event, held[1] - 1)

    def wake(self, slot: str) -> None:
        held = self._events.pop(slot, None)
        if held is not None:
            held[0].set()

    def __len__(self) -> int:
        return len(self._events)
