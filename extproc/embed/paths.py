"""Where built models live: ``$LLM_GATE_MODEL_DIR`` or ``~/.cache/llm-gate/models``."""

from __future__ import annotations

import os
from pathlib import Path


def default_model_dir() -> Path:
    env = os.environ.get("LLM_GATE_MODEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-gate" / "models"
