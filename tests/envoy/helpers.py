"""A second Envoy next to a test stack, run on a bootstrap the test shapes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from load.stack import envoy_command, free_port, wait_http, wait_port

LOOPBACK = "127.0.0.1"


@contextmanager
def running(args: list[str], log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(port, 30, proc)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


@contextmanager
def envoy(doc: dict[str, Any], listen: int, admin: int) -> Iterator[str]:
    """Run Envoy on `doc`; yields the admin URL once Envoy is ready."""
    work = Path(tempfile.mkdtemp(prefix="llm-gate-envoy-"))
    args = envoy_command(doc, work / "envoy.yaml", "warn")
    with running(args, work / "envoy.log", listen):
        url = f"http://{LOOPBACK}:{admin}"
        wait_http(url + "/ready", 30)
        yield url


@contextmanager
def rogue_extproc() -> Iterator[int]:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="llm-gate-rogue-"))
    args = [sys.executable, "-m", "tests.envoy.rogue_extproc", "--port", str(port)]
    with running(args, work / "rogue.log", port):
        yield port


def stat(admin: str, suffix: str) -> int:
    """The sum of Envoy's counters whose name ends with `suffix`."""
    with urllib.request.urlopen(admin + "/stats", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(int(v) for k, _, v in (line.partition(": ") for line in lines) if k.endswith(suffix))
