"""The gate's processes own their lifecycle: a rolling restart drops nothing, workers die with
their supervisor, and a supervisor whose port is taken says so and exits."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from extproc.healthcheck import main as healthcheck
from load.drill_rollout import drill, rollout_stack
from load.stack import free_ports, wait_port


def test_a_rolling_restart_of_every_gate_process_under_load_fails_no_request() -> None:
    with rollout_stack(drain_s=6) as stack:
        result = asyncio.run(drill(stack, concurrency=6, settle_s=3))
    assert len(result.rolled) == 2
    assert sum(result.statuses.values()) > 100
    assert result.failed == 0, (result.statuses, result.errors)


def _serve(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "extproc.cli", "serve", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _config(tmp_path: Path) -> tuple[Path, list[int]]:
    first = free_ports(2)
    path = tmp_path / "gate.yaml"
    server = {"port": first, "workers": 2, "metrics_port": None, "grace_seconds": 1, "drain_seconds": 0}
    path.write_text(yaml.safe_dump({"server": server}))
    return path, [first, first + 1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_workers_die_with_their_supervisor_and_a_new_one_takes_the_ports(tmp_path: Path) -> None:
    config, ports = _config(tmp_path)
    first = _serve(config, tmp_path / "first.log")
    second = None
    try:
        for port in ports:
            wait_port(port, 60, first)
        workers = [int(p) for p in Path(f"/proc/{first.pid}/task/{first.pid}/children").read_text().split()]
        assert len(workers) >= 2
        os.kill(first.pid, signal.SIGKILL)  # as an OOM kill would
        first.wait(5)
        deadline = time.monotonic() + 2
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers), "workers outlived their supervisor by 2 s"
        second = _serve(config, tmp_path / "second.log")
        for port in ports:
            wait_port(port, 60, second)
        deadline = time.monotonic() + 30
        while healthcheck([f"127.0.0.1:{ports[1]}"]) != 0:
            assert time.monotonic() < deadline and second.poll() is None
            time.sleep(0.2)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def test_a_supervisor_whose_port_is_taken_says_so_and_exits(tmp_path: Path) -> None:
    config, ports = _config(tmp_path)
    with socket.socket() as sock:  # something else holds the second worker's port
        sock.bind(("127.0.0.1", ports[1]))
        sock.listen()
        proc = _serve(config, tmp_path / "serve.log")
        try:
            assert proc.wait(60) == 1
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "serve.log").read_text()
    assert f"cannot listen on port {ports[1]}" in log
    assert log.count("restarting") == 0
