"""Work proportional to a big prompt, in a child process at the lowest CPU priority.

Off the event loop is not enough on a busy machine. A 512 KB prompt is ~0.3 s of tokenizer
CPU: in a thread at normal priority it takes its share of the cores from the event loop,
Envoy and every small request; in a thread at low priority it stalls the event loop instead,
because it must take the GIL back after each piece, and a low-priority thread that holds the
GIL while the scheduler runs others keeps every coroutine waiting. A child process has its own
GIL; at idle priority it gets the cores the rest leave idle, so only the big prompt itself
waits. Idle priority is not all: on a busy two-core machine its bursts still moved the small
requests' p99, and the token count paces itself in it (`tokens.BACKGROUND_CPU_SHARE`).

One child per gate process, started with the first call (spawn: the gate's gRPC threads must
not be forked), restarted after a crash; a call it cannot run runs in a thread instead (as
the whole process does where no child can start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

log = logging.getLogger("llm_gate.background")

T = TypeVar("T")
NICE = 19


def _lower_priority(nice: int) -> None:
    """SCHED_IDLE where Linux allows it (below every nice level: a waking gate, Envoy or client
    thread takes the core at once), and `nice` in any case. Refused: the gate's priority."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(AttributeError, OSError):
        os.nice(nice)


class Background:
    """A lazily started single-worker process pool at `nice`."""

    def __init__(self, nice: int = NICE) -> None:
        self.nice = nice
        self._pool: ProcessPoolExecutor | None = None
        self._unavailable = False  # the child cannot start here: threads from now on

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_lower_priority,
                initargs=(self.nice,),
            )
        return self._pool

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the child (both must pickle); in a thread where no child can run it.
        What `fn` raises is raised here."""
        if not self._unavailable:
            try:
                future = self._executor().submit(fn, *args)
            except Exception as exc:  # e.g. spawn refused in a __main__ without its guard
                log.warning("no background process (%s); big prompts are counted in a thread", exc)
                self._unavailable = True
                self.close()
            else:
                try:
                    return await asyncio.wrap_future(future)
                except BrokenProcessPool as exc:
                    log.warning("background process lost (%s); this prompt in a thread", exc)
                    self.close()  # the next call starts a fresh child
        return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
