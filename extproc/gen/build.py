"""Compile proto/ into this folder: ``python -m extproc.gen.build``.

The generated files are committed; ``tests/scheduler/test_gen.py`` regenerates them into a
temporary folder and fails when they differ, so an edited proto cannot go unbuilt.
protoc writes the stubs' import of the messages as an absolute module path; it is rewritten
to a relative import so the package works wherever it is installed. The stubs refuse to
import under a grpcio older than the version they name; they name `GRPC_FLOOR`, the floor
pyproject.toml asks for, not the version of the grpcio-tools that happened to build them (a
new patch release of the tools would otherwise change the committed files and raise the
floor unseen).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTOS = ["llmgate/scheduler/v1/scheduler.proto"]
OUT = Path(__file__).resolve().parent
_IMPORT = re.compile(r"^from llmgate\.scheduler\.v1 import (\w+_pb2) as", re.MULTILINE)
_GRPC_VERSION = re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.MULTILINE)
GRPC_FLOOR = "1.85.1"


def generate(out: Path) -> list[Path]:
    """Write the generated modules (flat) into `out`; return their paths."""
    with tempfile.TemporaryDirectory() as tmp:
        include = str(Path(protoc.__file__).parent / "_proto")
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", *PROTOS]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        written = []
        for path in sorted(Path(tmp).rglob("*_pb2*.py*")):
            text = _IMPORT.sub(r"from . import \1 as", path.read_text())
            text = _GRPC_VERSION.sub(f"GRPC_GENERATED_VERSION = '{GRPC_FLOOR}'", text)
            target = out / path.name
            target.write_text(text)
            written.append(target)
    return written


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    for path in generate(out):
        print(path.relative_to(out) if out != OUT else path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
