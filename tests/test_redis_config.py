"""`store.redis`: the three topologies as configuration, secrets from files or the
environment only, and clients that reach a real node, Sentinel master and Cluster."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml
from pydantic import ValidationError
from redis.exceptions import AuthenticationError, ResponseError

from extproc.config import Store
from extproc.redis_conn import connect
from load.redis_topology import ClusterGroup, SentinelGroup
from load.stack import LOOPBACK, free_port, redis_command, wait_port


def test_a_bare_url_is_a_single_node() -> None:
    topology = Store(redis_url="redis://127.0.0.1:6380/2").topology
    assert topology is not None and topology.mode == "single" and topology.url == "redis://127.0.0.1:6380/2"
    assert Store().topology is None  # the in-process store


@pytest.mark.parametrize(("section", "error"), [
    ({"redis_url": "redis://:hunter2@h:6379/0"}, "carries a password"),
    ({"redis": {"url": "redis://user:hunter2@h:6379/0"}}, "carries a password"),
    ({"redis": {"mode": "sentinel"}}, "needs sentinels"),
    ({"redis": {"mode": "sentinel", "sentinels": ["h"]}}, "not host:port"),
    ({"redis": {"mode": "cluster"}}, "needs nodes"),
    ({"redis": {"mode": "cluster", "nodes": ["h:1"], "db": 1}}, "only db 0"),
    ({"redis": {"mode": "single"}}, "needs url"),
    ({"redis_url": "redis://h:1/0", "redis": {"url": "redis://h:1/0"}}, "not both"),
    ({"redis": {"url": "http://h:1"}}, "scheme"),
    ({"redis": {"url": "redis://h:1", "password": "x"}}, "Extra inputs"),
    ({"redis": {"url": "rediss://h:1", "tls": {"cert_file": "/c.pem"}}}, "go together"),
])
def test_bad_sections_say_what_is_wrong(section: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        Store(**section)


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server that wants the password `s3cret`."""
    port = free_port()
    args = [*redis_command(port, tmp_path_factory.mktemp("locked")), "--requirepass", "s3cret"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, 10, proc)
    yield port
    proc.kill()
    proc.wait(5)


async def test_the_password_comes_from_a_file_or_the_environment(
    locked_redis: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://{LOOPBACK}:{locked_redis}/0"
    secret = tmp_path / "redis-password"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("GATE_REDIS_PASSWORD", "s3cret")
    sections = ({"url": url, "password_file": str(secret)},
                {"url": url, "password_env": "GATE_REDIS_PASSWORD"})
    for section in sections:
        client: Any = connect(Store(redis=section))
        assert await client.ping()
        await client.aclose()
    client = connect(Store(redis_url=url))
    with pytest.raises((AuthenticationError, ResponseError)):
        await client.ping()  # no password: refused
    await client.aclose()
    monkeypatch.delenv("GATE_REDIS_PASSWORD")
    with pytest.raises(ValueError, match="GATE_REDIS_PASSWORD is not set"):
        connect(Store(redis={"url": url, "password_env": "GATE_REDIS_PASSWORD"}))


async def test_sentinel_mode_reaches_the_master(redis_sentinel: SentinelGroup) -> None:
    client: Any = connect(Store(redis=redis_sentinel.store_config()))
    assert isinstance(client, aioredis.Redis)
    await client.set("gate:test:sentinel", "1")
    assert (await client.info("replication"))["role"] == "master"
    server = await client.info("server")
    assert int(server["tcp_port"]) == redis_sentinel.master_port()
    await client.aclose()


async def test_cluster_mode_discovers_every_master_from_one_seed(redis_cluster: ClusterGroup) -> None:
    seed = redis_cluster.store_config()["nodes"][:1]
    client: Any = connect(Store(redis={"mode": "cluster", "nodes": seed}))
    assert isinstance(client, aioredis.RedisCluster)
    for i in range(30):  # keys on every master
        await client.set(f"gate:test:{i}", i)
    masters = {n.port for n in client.get_primaries()}
    assert masters == set(redis_cluster.masters())
    await client.aclose()


def test_the_command_line_tools_reach_a_cluster_from_the_config(
    redis_cluster: ClusterGroup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from extproc.cli import main as cli
    from extproc.ratelimit.admin import main as blocks_cli

    redis_cluster.flush()
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({"store": {"redis": redis_cluster.store_config()}}))
    assert cli(["breaker", "force", "primary", "open", "--config", str(path)]) == 0
    assert cli(["breaker", "status", "--config", str(path), "--json"]) == 0
    assert '"state": "open"' in capsys.readouterr().out
    assert blocks_cli(["list", "--config", str(path)]) == 0
    assert "no blocks" in capsys.readouterr().out
