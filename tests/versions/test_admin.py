"""`llm-gate versions` against a real Redis, and the gates' monitor adopting what it wrote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from extproc.cli import main
from extproc.config import load_config
from extproc.metrics import Metrics
from extproc.versions import shared
from extproc.versions.monitor import VersionMonitor
from extproc.versions.traffic import Traffic
from load.stack import RedisServer


@pytest.fixture
def gate_yaml(tmp_path: Path, redis_server: RedisServer) -> Path:
    path = tmp_path / "gate.yaml"
    path.write_text(f"""
store: {{redis_url: "{redis_server.url}"}}
routing:
  pools: {{a: {{cluster: a}}, b: {{cluster: b}}}}
  models: {{}}
  default_pool: null
  version_sync: {{key_prefix: "cli:{os.getpid()}:{tmp_path.name}:"}}
  versions:
    chat:
      versions: [{{name: v1, pool: a, weight: 100}}, {{name: v2, pool: b, canary: true}}]
      rollout: {{steps: [5, 25, 100], hold_s: 60}}
    solo:
      versions: [{{name: only, pool: a, weight: 1}}]
""")
    return path


async def test_set_weight_promote_rollback_start_and_status(
    gate_yaml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(gate_yaml)
    client = aioredis.Redis.from_url(config.store.redis_url or "")
    prefix = config.routing.version_sync.key_prefix
    monitor = VersionMonitor(config.routing, Traffic(), Metrics(), client)

    def run(*argv: str) -> int:
        return main(["versions", *argv, "--config", str(gate_yaml)])

    try:
        assert await _in_thread(run, "set-weight", "chat", "15") == 0
        assert "canary v2 at 15% (manual" in capsys.readouterr().out
        await monitor.sync_once()
        table = monitor.traffic.table("chat", config.routing.versions["chat"])
        assert [(s.name, s.share) for s in table] == [("v2", 0.15), ("v1", 0.85)]  # a gate adopted it

        for argv, phase, weight in (
            (("promote", "chat"), "done", 100.0),
            (("rollback", "chat"), "rolled_back", 0.0),
            (("start", "chat"), "rolling", 5.0),
        ):
            assert await _in_thread(run, *argv) == 0
            state = await shared.read_state(client, prefix, "chat")
            assert state is not None and (state.phase, state.weight) == (phase, weight)
        capsys.readouterr()
        assert await _in_thread(run, "status") == 0
        out = capsys.readouterr().out
        assert "chat: rolling" in out and "v2" in out and "solo: config" in out

        assert await _in_thread(run, "rollback", "solo") == 2  # no canary to roll back
        assert await _in_thread(run, "promote", "nope") == 2
    finally:
        await monitor.close()


async def _in_thread(run: object, *argv: str) -> int:
    """The command runs its own event loop (asyncio.run), so it runs in a thread here."""
    import asyncio

    return int(await asyncio.to_thread(run, *argv))  # type: ignore[arg-type]


def test_set_weight_needs_a_percent(gate_yaml: Path) -> None:
    with pytest.raises(SystemExit):
        main(["versions", "set-weight", "chat", "--config", str(gate_yaml)])
    with pytest.raises(SystemExit):
        main(["versions", "set-weight", "chat", "150", "--config", str(gate_yaml)])
