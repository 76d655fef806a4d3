"""A throwaway etcd server (Debian's `etcd-server`, 3.4) on free loopback ports."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time

from load.stack import LOOPBACK, free_port


class EtcdServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.peer_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="llm-gate-etcd-")
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        binary = shutil.which("etcd")
        if binary is None:
            raise FileNotFoundError("no etcd binary: apt-get install etcd-server")
        client, peer = f"http://{LOOPBACK}:{self.port}", f"http://{LOOPBACK}:{self.peer_port}"
        return [
            binary, "--name", "gate-test", "--data-dir", self.dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"gate-test={peer}",
        ]

    def start(self, timeout: float = 20.0) -> EtcdServer:
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}")
            try:
                self.put("/llm-gate/ping", "1")
                return self
            except Exception:
                time.sleep(0.1)
        raise TimeoutError(f"etcd on {LOOPBACK}:{self.port} not ready after {timeout}s")

    def put(self, key: str, value: str) -> None:
        asyncio.run(self._call("put", key, value))

    def delete(self, key: str) -> None:
        asyncio.run(self._call("delete", key))

    async def _call(self, op: str, key: str, value: str = "") -> None:
        import aetcd

        async with aetcd.Client(host=LOOPBACK, port=self.port, timeout=2) as client:
            if op == "put":
                await client.put(key.encode(), value.encode())
            else:
                await client.delete(key.encode())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
