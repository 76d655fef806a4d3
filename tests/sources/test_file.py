"""The file watch: a ConfigMap's `..data` swap and an edit in place both trigger one reload."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from extproc.sources.file import fingerprint, watch_file


def configmap(root: Path, version: int, text: str) -> None:
    """What the kubelet does: a new timestamped directory, then `..data` swapped to it at once."""
    target = root / f"..2026_12_02_{version}"
    target.mkdir()
    (target / "gate.yaml").write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, root / "..data")
    if not (root / "gate.yaml").is_symlink():
        (root / "gate.yaml").symlink_to("..data/gate.yaml")


def edit_in_place(path: Path, text: str) -> None:
    Path(os.path.realpath(path)).write_text(text)


async def test_a_configmap_swap_and_an_edit_each_reload_once(tmp_path: Path) -> None:
    configmap(tmp_path, 1, "routing: {}\n")
    path = tmp_path / "gate.yaml"
    reloads: list[str] = []

    async def reload() -> None:
        reloads.append(path.read_text())

    task = asyncio.get_running_loop().create_task(watch_file(path, 0.05, reload))
    try:
        await asyncio.sleep(0.2)
        assert reloads == []  # nothing changed
        configmap(tmp_path, 2, "cache: {enabled: false}\n")
        await asyncio.sleep(0.3)
        assert reloads == ["cache: {enabled: false}\n"]
        edit_in_place(path, "cache: {enabled: true, ttl_s: 5}\n")
        await asyncio.sleep(0.3)
        assert reloads[1:] == ["cache: {enabled: true, ttl_s: 5}\n"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_stale_start_reloads_at_once_and_a_missing_file_waits(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    assert fingerprint(path) is None
    calls: list[int] = []

    async def reload() -> None:
        calls.append(1)

    task = asyncio.get_running_loop().create_task(watch_file(path, 0.05, reload, stale=True))
    try:
        await asyncio.sleep(0.2)
        assert calls == [1]  # the stale start, and no reload for a file that is not there
        path.write_text("routing: {}\n")
        await asyncio.sleep(0.2)
        assert calls == [1, 1]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
