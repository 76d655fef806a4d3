"""The committed generated code is what the proto compiles to today."""

from __future__ import annotations

from pathlib import Path

from extproc.gen import build


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in build.generate(tmp_path)}
    committed = {name: (build.OUT / name).read_text() for name in fresh}
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"regenerate with `python -m extproc.gen.build`: {stale} differ from the proto"
    assert set(fresh) == {"scheduler_pb2.py", "scheduler_pb2.pyi", "scheduler_pb2_grpc.py"}


def test_generated_stubs_import_the_messages_relatively() -> None:
    text = (build.OUT / "scheduler_pb2_grpc.py").read_text()
    assert "from . import scheduler_pb2" in text
    assert "from llmgate" not in text
