"""The committed generated code is what the proto compiles to today."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from extproc.gen import build


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in build.generate(tmp_path)}
    committed = {name: (build.OUT / name).read_text() for name in fresh}
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"regenerate with `python -m extproc.gen.build`: {stale} differ from the proto"
    assert set(fresh) == {"scheduler_pb2.py", "scheduler_pb2.pyi", "scheduler_pb2_grpc.py"}


def test_the_generated_code_asks_for_the_grpcio_and_protobuf_the_package_requires() -> None:
    """The stubs refuse an older grpcio at import: the version they name is the floor a user
    installs against, whatever grpcio-tools built them."""
    text = (build.OUT / "scheduler_pb2_grpc.py").read_text()
    assert f"GRPC_GENERATED_VERSION = '{build.GRPC_FLOOR}'" in text
    pyproject = tomllib.loads((build.REPO / "pyproject.toml").read_text())
    needs = pyproject["project"]["dependencies"]
    assert f"grpcio>={build.GRPC_FLOOR}" in needs
    # the messages refuse an older protobuf at import: the package asks for at least that one
    generated_for = re.search(r"^# Protobuf Python Version: (\S+)$",
                              (build.OUT / "scheduler_pb2.py").read_text(), re.MULTILINE)
    assert generated_for is not None
    assert any(n.startswith(f"protobuf>={generated_for.group(1)},") for n in needs)


def test_generated_stubs_import_the_messages_relatively() -> None:
    text = (build.OUT / "scheduler_pb2_grpc.py").read_text()
    assert "from . import scheduler_pb2" in text
    assert "from llmgate" not in text
