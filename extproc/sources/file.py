"""Watch the config file and reload when it changes (a Kubernetes ConfigMap mount included).

A ConfigMap volume swaps a `..data` symlink to a new directory: the path the gate was given
stays, the file behind it is new. So the watch follows links to the file itself and polls
its identity (device, inode, size, mtime): a swap changes the inode, an edit in place the
mtime or size. A change runs the same reload as SIGHUP: validated first, an invalid file
refused and counted, the running config kept. A file edited in place (not swapped) is read
only once it stopped changing for a moment, so a half-written file is not loaded.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

log = logging.getLogger("llm_gate.sources")

Fingerprint = tuple[str, int, int, int, int] | None
SETTLE_S = 0.05  # a change counts once the file has stayed the same this long


def fingerprint(path: Path) -> Fingerprint:
    """What identifies the file behind `path` now; None while it cannot be read (mid-swap)."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


async def watch_file(
    path: Path, interval_s: float, reload: Callable[[], Awaitable[None]], *, stale: bool = False
) -> None:
    """Poll `path` every `interval_s` and await `reload()` after each change; runs until
    cancelled. `stale`: the file already differs from the running config (reload at once)."""
    last = fingerprint(path)
    if stale:
        await reload()
    while True:
        await asyncio.sleep(interval_s)
        now = fingerprint(path)
        if now is None or now == last:
            continue  # gone for a moment (a swap in progress) or unchanged
        await asyncio.sleep(SETTLE_S)  # a writer still at work changes it again: wait for that
        if fingerprint(path) != now:
            continue
        last = now
        log.info("config %s changed; reloading", path)
        try:
            await reload()
        except Exception:
            log.exception("reload after a change of %s failed", path)
