"""Real Redis topologies on loopback, for tests and drills: Sentinel and Cluster.

`SentinelGroup`: one master, two replicas and three sentinels (quorum 2) watching it under
the name `gate`. `ClusterGroup`: six nodes joined by `redis-cli --cluster create` into
three masters with a replica each. Both keep nothing on disk, pick free ports themselves
and stop every process they started on `close()`. Each also gives the gate's
`store.redis` section that points at it.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .stack import LOOPBACK, redis_command, wait_port

MASTER_NAME = "gate"


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def cluster_ports(count: int) -> list[int]:
    """`count` ports whose cluster bus port (+10000) is free too, below the ephemeral range."""
    found: list[int] = []
    while len(found) < count:
        port = random.randrange(20_000, 30_000)
        if port not in found and _free(port) and _free(port + 10_000):
            found.append(port)
    return found


def wait_until(check: Any, timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(step)
    raise TimeoutError(f"{what} not reached in {timeout}s (last error: {last!r})")


@dataclass
class _Procs:
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="llm-gate-topology-")))
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)  # by port
    args: dict[int, list[str]] = field(default_factory=dict)

    def spawn(self, port: int, args: list[str]) -> None:
        log = open(self.dir / f"{port}.log", "wb")
        self.args[port] = args
        self.procs[port] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        wait_port(port, 15, self.procs[port])

    def kill(self, port: int) -> None:
        """SIGKILL, as a crash would."""
        proc = self.procs.pop(port, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)

    def restart(self, port: int) -> None:
        self.spawn(port, self.args[port])

    def close(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelGroup:
    """1 master + 2 replicas + 3 sentinels; failover ~1-3 s after the master stops answering."""

    def __init__(self, down_after_ms: int = 1000) -> None:
        self.p = _Procs()
        self.data_ports = cluster_ports(3)
        self.sentinel_ports = cluster_ports(3)
        self.down_after_ms = down_after_ms
        self.first_master = self.data_ports[0]

    def start(self) -> SentinelGroup:
        master, *replicas = self.data_ports
        self.p.spawn(master, redis_command(master, self.p.dir))
        for port in replicas:
            self.p.spawn(port, [*redis_command(port, self.p.dir), "--replicaof", LOOPBACK, str(master)])
        for port in replicas:
            wait_until(lambda port=port: _link_up(port), 15, f"replica {port} in sync")
        for port in self.sentinel_ports:
            conf = self.p.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind {LOOPBACK}\nprotected-mode no\ndir {self.p.dir}\n"
                f"sentinel monitor {MASTER_NAME} {LOOPBACK} {master} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 2\n"
            )
            self.p.spawn(port, ["redis-server", str(conf), "--sentinel"])
        wait_until(lambda: all(_sentinel_ready(p) for p in self.sentinel_ports), 20,
                   "sentinels see the replicas")
        return self

    def master_port(self) -> int:
        """The master as the sentinels name it now."""
        found: Any = redis.Redis(port=self.sentinel_ports[0]).sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(found[1])

    def kill_master(self) -> int:
        port = self.master_port()
        self.p.kill(port)
        return port

    def wait_promoted(self, old: int, timeout: float = 20) -> int:
        """Wait for the sentinels to name another master that answers as one; its port."""
        wait_until(lambda: self.master_port() != old and _role(self.master_port()) == "master", timeout,
                   "a replica promoted")
        return self.master_port()

    def flush(self) -> None:
        redis.Redis(port=self.master_port()).flushall()

    def store_config(self) -> dict[str, Any]:
        return {"mode": "sentinel", "master_name": MASTER_NAME,
                "sentinels": [f"{LOOPBACK}:{p}" for p in self.sentinel_ports]}

    def close(self) -> None:
        self.p.close()


class ClusterGroup:
    """Six nodes: three masters, one replica each (`redis-cli --cluster create`)."""

    def __init__(self, node_timeout_ms: int = 1000) -> None:
        self.p = _Procs()
        self.ports = cluster_ports(6)
        self.node_timeout_ms = node_timeout_ms

    def start(self) -> ClusterGroup:
        for port in self.ports:
            self.p.spawn(port, self._command(port))
        create = ["redis-cli", "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in self.ports),
                  "--cluster-replicas", "1", "--cluster-yes"]
        subprocess.run(create, check=True, capture_output=True, timeout=60)
        self.wait_ok()
        return self

    def _command(self, port: int) -> list[str]:
        return [*redis_command(port, self.p.dir), "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # A replica may take over however long it was cut off (what a drill wants).
                "--cluster-replica-validity-factor", "0"]

    def wait_ok(self, timeout: float = 30) -> None:
        """Every running node says the cluster is ok and three masters serve all slots."""
        def ok() -> bool:
            masters = self.masters()
            for port in self.p.procs:
                info = _node(port).execute_command("CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return False
                if port not in masters and not _link_up(port):  # a replica still syncing
                    return False
            return len(masters) == 3
        wait_until(ok, timeout, "cluster state ok")

    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Master port -> its slot ranges, as a live node sees it."""
        port = next(iter(self.p.procs))
        out: dict[int, list[tuple[int, int]]] = {}
        for start, end, master, *_ in _node(port).execute_command("CLUSTER", "SLOTS"):
            out.setdefault(int(master[1]), []).append((int(start), int(end)))
        return out

    def master_of(self, key: str) -> int:
        slot = int(_node(next(iter(self.p.procs))).execute_command("CLUSTER", "KEYSLOT", key))
        return next(p for p, ranges in self.masters().items() if any(a <= slot <= b for a, b in ranges))

    def migrate_slot_of(self, key: str, to: int | None = None) -> tuple[int, int, int]:
        """Move the slot of `key` to another master, live, as `redis-cli --cluster reshard`
        does (IMPORTING / MIGRATING, MIGRATE of its keys, SETSLOT NODE); (slot, from, to)."""
        slot = int(_node(next(iter(self.p.procs))).execute_command("CLUSTER", "KEYSLOT", key))
        source = self.master_of(key)
        target = to or next(p for p in self.masters() if p != source)
        src, dst = _node(source), _node(target)
        src_id, dst_id = (n.execute_command("CLUSTER", "MYID").decode() for n in (src, dst))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
            src.execute_command("MIGRATE", LOOPBACK, target, "", 0, 5000, "KEYS", *keys)
        for port in (target, source, *self.masters()):
            _node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return slot, source, target

    def kill(self, port: int) -> None:
        self.p.kill(port)

    def restart(self, port: int) -> None:
        self.p.restart(port)

    def flush(self) -> None:
        for port in self.masters():
            redis.Redis(port=port).flushall()

    def store_config(self) -> dict[str, Any]:
        return {"mode": "cluster", "nodes": [f"{LOOPBACK}:{p}" for p in self.ports[:3]]}

    def close(self) -> None:
        self.p.close()


def _node(port: int) -> Any:
    return redis.Redis(port=port, socket_timeout=2)


def _role(port: int) -> str:
    info: dict[str, Any] = redis.Redis(port=port, socket_timeout=1).info("replication")
    return str(info["role"])


def _link_up(port: int) -> bool:
    info: dict[str, Any] = redis.Redis(port=port, socket_timeout=1).info("replication")
    return info.get("master_link_status") == "up"


def _sentinel_ready(port: int) -> bool:
    replicas: Any = _node(port).sentinel_slaves(MASTER_NAME)
    sentinels: Any = _node(port).sentinel_sentinels(MASTER_NAME)
    return len(replicas) >= 2 and len(sentinels) >= 2
