from __future__ import annotations

from pathlib import Path

import pytest

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.embed.build import build_e5, build_minilm


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.getbasetemp() / "models"
    build_e5(root)  # idempotent: shared with the embed tests
    build_minilm(root)
    return root


@pytest.fixture(scope="session")
def e5(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("e5-small", model_dir)


@pytest.fixture(scope="session")
def minilm(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("minilm", model_dir)
