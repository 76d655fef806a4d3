"""A benchmark or drill stopped by a time-out leaves nothing behind: no simulator, gate, Envoy
or Redis it started, and no temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def marked(mark: str) -> list[int]:
    """Processes whose environment carries `mark` (children inherit it, whatever their group)."""
    found = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            if mark.encode() in (pid_dir / "environ").read_bytes():
                stat = (pid_dir / "stat").read_text()
                if stat.split(")")[-1].split()[0] != "Z":
                    found.append(int(pid_dir.name))
        except OSError:
            continue
    return found


def test_a_drill_stopped_by_timeout_leaves_no_process_and_no_folder() -> None:
    mark = f"LLM_GATE_CLEANUP_{uuid.uuid4().hex}"
    temp = Path(tempfile.mkdtemp(prefix="llm-gate-cleanup-"))
    env = {**os.environ, mark: "1", "TMPDIR": str(temp)}
    # Far longer than the time-out: it is stopped mid-run, with its whole stack up.
    out = str(temp / "r.md")
    command = [sys.executable, "-m", "load.drill_cancel", "--requests", "20000", "--out", out]
    started = time.monotonic()
    proc = subprocess.run(
        ["timeout", "-s", "TERM", "15", *command], env=env, capture_output=True, timeout=150
    )
    assert proc.returncode != 0 and time.monotonic() - started < 60
    deadline = time.monotonic() + 10
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marked(mark) == [], "processes outlived the command"
    assert [p.name for p in temp.iterdir()] == [], "temporary folders left behind"
    temp.rmdir()
