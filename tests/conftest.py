from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from extproc.config import Config
from extproc.embed import OnnxEmbedder, load_embedder
from extproc.embed.build import build_e5, build_minilm
from extproc.metrics import Metrics
from extproc.pipeline import Pipeline
from extproc.server import start_server
from load.stack import free_port
from tests.redis_server import RedisServer

# The machines are shared and noisy: a slow example is not a failure.
settings.register_profile("gate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gate")

REPO = Path(__file__).resolve().parent.parent
PARAPHRASE_DATA = REPO.parent / "shared" / "data" / "paraphrase"


class GateThread:
    """A gate server with a pipeline of the test's choosing, on its own loop in a thread."""

    def __init__(self, pipeline: Pipeline, port: int) -> None:
        self.pipeline = pipeline
        self.port = port
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server, _, _ = self.loop.run_until_complete(
            start_server(self.pipeline, "127.0.0.1", self.port, 4 * 1024 * 1024)
        )
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> GateThread:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture
def gate_thread() -> Iterator[type[GateThread]]:
    yield GateThread


@pytest.fixture
def port() -> int:
    return free_port()


def pipeline_of(stages: list, config: Config | None = None) -> Pipeline:  # type: ignore[type-arg]
    config = config or Config()
    return Pipeline(stages, config.routing.handled_paths, Metrics())


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


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
