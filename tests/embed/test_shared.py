"""A config reload shares the running process's models instead of loading them again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from extproc.app import build_pipeline
from extproc.config import Config
from extproc.embed import BatchingEmbedder, shared_embedder
from extproc.metrics import Metrics


def test_the_same_files_and_options_give_the_same_loaded_model(model_dir: Path, tmp_path: Path) -> None:
    first = shared_embedder("minilm", model_dir)
    assert shared_embedder("minilm", model_dir) is first
    assert shared_embedder("minilm", model_dir, threads=2) is not first  # other options: its own
    copy = tmp_path / "minilm"
    shutil.copytree(model_dir / "minilm", copy)
    mine = shared_embedder("minilm", tmp_path)
    assert mine is not first  # another folder
    assert shared_embedder("minilm", tmp_path) is mine
    later = os.stat(copy / "model.onnx").st_mtime_ns + 10**9
    os.utime(copy / "model.onnx", ns=(later, later))  # the model rebuilt in place
    rebuilt = shared_embedder("minilm", tmp_path)
    assert rebuilt is not mine
    assert (rebuilt.embed_sync(["hello"]) == mine.embed_sync(["hello"])).all()


async def test_a_reloaded_pipeline_embeds_with_the_running_pipelines_model(model_dir: Path) -> None:
    config = Config.model_validate(
        {"cache": {"semantic": {"enabled": True, "embedder": "minilm", "model_dir": str(model_dir),
                                "target_precision": 0.8}}}
    )
    running = build_pipeline(config, Metrics())
    reloaded = build_pipeline(config, Metrics())
    old, new = running.services.matchers.default, reloaded.services.matchers.default
    assert old is not None and new is not None
    try:
        assert old.embedder is not new.embedder  # each pipeline its own batching threads
        assert isinstance(old.embedder, BatchingEmbedder) and isinstance(new.embedder, BatchingEmbedder)
        assert old.embedder.inner is new.embedder.inner  # one model in the process
    finally:
        await running.aclose()  # the retiring pipeline goes first, as on a reload
    try:
        assert (await new.embedder.embed("still embedding")).shape == (new.embedder.dim,)
    finally:
        await reloaded.aclose()
