"""Files of public repositories read in place at a pinned commit, from clones kept in
REPOS/<owner>/<name> (training and evaluation data: nothing is copied into the project)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def blob(repos: Path, repo: str, commit: str, path: str) -> bytes:
    out = subprocess.run(
        ["git", "-C", str(repos / repo), "show", f"{commit}:{path}"], capture_output=True, check=True
    )
    return out.stdout
