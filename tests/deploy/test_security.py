"""The admin endpoint on its own address with a token, and TLS (with client verification) on
the gate's gRPC port: one real gate process, certificates made by openssl for the test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from load.stack import free_port, wait_port

TOKEN = "s3cret-admin-token"


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def make_certs(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", d / "ca.key", "-out", d / "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr")
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.pem", "-CAkey", d / "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", d / f"{name}.ext", "-out", d / f"{name}.pem")


class Gate:
    def __init__(self, port: int, admin_port: int, certs: Path) -> None:
        self.port, self.admin_port, self.certs = port, admin_port, certs


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    d = tmp_path_factory.mktemp("tls")
    make_certs(d)
    (d / "token").write_text(TOKEN + "\n")
    port, admin_port = free_port(), free_port()
    config = {
        "server": {
            "port": port,
            "metrics_port": None,
            "admin_port": admin_port,
            "admin_token_file": str(d / "token"),
            "tls": {"cert_file": str(d / "server.pem"), "key_file": str(d / "server.key"),
                    "client_ca_file": str(d / "ca.pem")},
        },
        "cache": {"semantic": {"enabled": False}},
    }
    (d / "gate.yaml").write_text(yaml.safe_dump(config))
    log = open(d / "gate.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "extproc.cli", "serve", "--config", str(d / "gate.yaml")],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_port(admin_port, 60, proc)
        yield Gate(port, admin_port, d)
    finally:
        proc.terminate()
        proc.wait(30)


def health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 20
    while True:
        try:
            return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status)
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_grpc_port_speaks_tls_and_wants_a_client_certificate(gate: Gate) -> None:
    d = gate.certs
    ca = (d / "ca.pem").read_bytes()
    good = grpc.ssl_channel_credentials(ca, (d / "client.key").read_bytes(), (d / "client.pem").read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{gate.port}", good) as channel:
        assert health(channel) == health_pb2.HealthCheckResponse.SERVING
    # No client certificate: the handshake is refused.
    with grpc.secure_channel(f"127.0.0.1:{gate.port}", grpc.ssl_channel_credentials(ca)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
    # Plaintext gets nothing either.
    with grpc.insecure_channel(f"127.0.0.1:{gate.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)


def test_the_admin_endpoint_wants_its_token(gate: Gate) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{gate.admin_port}", timeout=10) as admin:
        assert admin.get("/admin/blocks").status_code == 401
        wrong = admin.get("/admin/blocks", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "admin token" in wrong.json()["error"]["message"]
        ok = admin.get("/admin/blocks", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.json() == {"blocks": []}


def test_the_admin_endpoint_refuses_to_start_off_loopback_without_a_token(tmp_path: Path) -> None:
    config = {"server": {"port": free_port(), "metrics_port": None, "admin_port": free_port(),
                         "admin_host": "0.0.0.0", "admin_token_env": "LLM_GATE_TEST_NO_SUCH_TOKEN"},
              "cache": {"semantic": {"enabled": False}}}
    (tmp_path / "gate.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [sys.executable, "-m", "extproc.cli", "serve", "--config", str(tmp_path / "gate.yaml")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0
    assert "not loopback" in out.stderr and "LLM_GATE_TEST_NO_SUCH_TOKEN" in out.stderr



@pytest.fixture
def tls_scheduler(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`llm-gate scheduler` with admission.scheduler_tls (mutual TLS); its address and settings."""
    make_certs(tmp_path)
    tls = {"cert_file": str(tmp_path / "server.pem"), "key_file": str(tmp_path / "server.key"),
           "client_ca_file": str(tmp_path / "ca.pem"), "ca_file": str(tmp_path / "ca.pem"),
           "client_cert_file": str(tmp_path / "client.pem"), "client_key_file": str(tmp_path / "client.key")}
    (tmp_path / "gate.yaml").write_text(yaml.safe_dump({"admission": {"scheduler_tls": tls}}))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "extproc.cli", "scheduler", "--pool", "primary", "--config",
         str(tmp_path / "gate.yaml"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, 60, proc)
        yield f"127.0.0.1:{port}", tls
    finally:
        proc.terminate()
        proc.wait(30)


async def test_gates_reach_a_tls_scheduler_only_with_its_ca_and_their_certificate(
    tls_scheduler: tuple[str, dict[str, str]],
) -> None:
    from extproc.metrics import Metrics
    from extproc.scheduler.client import RemoteScheduler
    from extproc.scheduler.queue import Granted, Ticket
    from extproc.scheduler.settings import SchedulerTLS

    address, tls = tls_scheduler
    full = SchedulerTLS.model_validate(tls)
    no_cert = full.model_copy(update={"client_cert_file": None, "client_key_file": None})
    remotes = {
        "tls": RemoteScheduler("primary", address, Metrics(), 2.0, 60, full),
        "no client cert": RemoteScheduler("primary", address, Metrics(), 2.0, 60, no_cert),
        "plaintext": RemoteScheduler("primary", address, Metrics(), 2.0, 60),
    }
    got = {name: await r.acquire(Ticket(f"t-{i}", deadline_s=2.0), 10, "t")
           for i, (name, r) in enumerate(remotes.items())}
    assert isinstance(got["tls"], Granted)
    assert got["no client cert"] is None and got["plaintext"] is None  # could not ask: fail open
    for remote in remotes.values():
        await remote.close()
