"""Run N gate processes, one port each, and keep them running.

Envoy opens one HTTP/2 connection per worker thread per endpoint, so processes sharing a
port (SO_REUSEPORT) get an uneven share; one port per process, all listed in Envoy's gate
cluster, spreads the streams evenly.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

from .config import Config

log = logging.getLogger("llm_gate.workers")


def _worker(config: Config, index: int, config_path: Path | None) -> None:
    from .app import run_process

    run_process(config, index, config_path)


def supervise(config: Config, config_path: Path | None = None) -> int:
    """SIGHUP: every worker reloads the file; a worker restarted later starts from it too."""
    ctx = multiprocessing.get_context("spawn")
    procs: dict[int, BaseProcess] = {}
    stopping = False

    def start(index: int) -> None:
        proc = ctx.Process(target=_worker, args=(config, index, config_path), name=f"gate-{index}")
        proc.start()
        procs[index] = proc

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
    while not stopping:
        time.sleep(0.2)
        for index, proc in list(procs.items()):
            if not proc.is_alive() and not stopping:
                log.warning("gate worker %d exited with %s; restarting", index, proc.exitcode)
                time.sleep(1.0)  # a worker that cannot start must not spin the supervisor
                start(index)
    for proc in procs.values():
        proc.join(timeout=10)
    return 0
