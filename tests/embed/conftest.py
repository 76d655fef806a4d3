from __future__ import annotations

from pathlib import Path

import pytest

from extproc.embed import OnnxEmbedder, load_embedder
from extproc.embed.build import build_e5, build_minilm


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.getbasetemp() / "models"
    build_e5(root)  # idempotent: the dedup tests' fixture reuses this directory
    build_minilm(root)
    return root


@pytest.fixture(scope="session")
def e5(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("e5-small", model_dir)


@pytest.fixture(scope="session")
def minilm(model_dir: Path) -> OnnxEmbedder:
    return load_embedder("minilm", model_dir)


MIXED = [
    "怎么开通花呗",
    "怎么关闭花呗",
    "花呗可以提前还款吗",
    "花呗不可以提前还款吗",
    "借呗的额度为什么降低了",
    "How do I reset my password?",
    "What is the refund policy for order 12345?",
    "A man is playing a guitar.",
    "花呗 payment failed again, what should I do?",
    "请问 iPhone 15 可以用花呗分期付款吗",
    "The quick brown fox jumps over the lazy dog near the riverbank on a sunny afternoon.",
    "ok",
]
