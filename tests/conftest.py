from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.embed.build import build_e5, build_minilm
from load.redis_topology import ClusterGroup, SentinelGroup
from load.stack import RedisServer

# The machines are shared and noisy: a slow example is not a failure.
settings.register_profile("gate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gate")



@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterGroup]:
    """A 6-node Redis Cluster (3 masters, 3 replicas), started once per run (~3 s)."""
    cluster = ClusterGroup().start()
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelGroup]:
    """1 master + 2 replicas + 3 sentinels, started once per run (~8 s)."""
    group = SentinelGroup().start()
    yield group
    group.close()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both embedding models, built once per run from the installed packages (~2 s)."""
    root = tmp_path_factory.getbasetemp() / "models"
    build_e5(root)
    build_minilm(root)
    return root


@pytest.fixture(scope="session")
def e5(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("e5-small", model_dir)


@pytest.fixture(scope="session")
def minilm(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("minilm", model_dir)
