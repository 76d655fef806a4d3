"""Run N gate processes, one port each, and keep them running.

Envoy opens one HTTP/2 connection per worker thread per endpoint, so processes sharing a
port (SO_REUSEPORT) get an uneven share; one port per process, all listed in Envoy's gate
cluster, spreads the streams evenly.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

from .config import Config

log = logging.getLogger("llm_gate.workers")
CANNOT_LISTEN = 3  # a worker's exit status when its port is taken: its supervisor gives up
YOUNG_S = 10.0  # a worker that exits sooner than this after its start is failing to start


def _die_with(parent: int) -> None:
    """Ask the kernel for a SIGINT (a quick stop) when the supervisor dies, however it dies
    (an OOM kill, SIGKILL): orphaned workers would keep serving the old config on the ports a
    new supervisor needs."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGINT)
    if os.getppid() != parent:  # it died before we asked
        raise SystemExit(0)


def _worker(config: Config, index: int, config_path: Path | None, parent: int) -> None:
    from .app import run_process

    _die_with(parent)
    run_process(config, index, config_path)


def supervise(config: Config, config_path: Path | None = None) -> int:
    """SIGHUP: every worker reloads the file; a worker restarted later starts from it too."""
    ctx = multiprocessing.get_context("spawn")
    procs: dict[int, BaseProcess] = {}
    stopping = False

    started: dict[int, float] = {}
    quick_exits: dict[int, int] = {}

    def start(index: int) -> None:
        proc = ctx.Process(
            target=_worker, args=(config, index, config_path, os.getpid()), name=f"gate-{index}"
        )
        proc.start()
        procs[index] = proc
        started[index] = time.monotonic()

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs.values():
            if proc.pid is not None and proc.is_alive():
                proc.terminate()

    def reload(signum: int, _frame: object) -> None:
        nonlocal config
        from .app import reread

        fresh = reread(config_path, config) if config_path else None
        config = fresh or config
        for proc in procs.values():
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGHUP)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    for index in range(config.server.workers):
        start(index)
    status = 0
    while not stopping:
        time.sleep(0.2)
        for index, proc in list(procs.items()):
            if not proc.is_alive() and not stopping and proc.exitcode == CANNOT_LISTEN:
                port = config.server.port + index
                log.error("gate worker %d cannot listen on port %d; stopping", index, port)
                stop(signal.SIGTERM, None)
                status = 1
            elif not proc.is_alive() and not stopping:
                # At once after a crash; a worker that keeps dying young backs off (up to 5 s).
                young = time.monotonic() - started[index] < YOUNG_S
                quick_exits[index] = quick_exits.get(index, 0) + 1 if young else 0
                delay = min(0.25 * 2 ** quick_exits[index], 5.0) if quick_exits[index] else 0.0
                log.warning("gate worker %d exited with %s; restarting in %.2fs", index, proc.exitcode, delay)
                time.sleep(delay)
                start(index)
    for proc in procs.values():
        proc.join(timeout=config.server.drain_seconds + config.server.grace_seconds + 5)
    return status
