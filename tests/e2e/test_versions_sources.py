"""A weight change from etcd, and from the watched file, under steady load through real Envoy:
in force on both gate workers within 2 s, no request failed; an invalid change refused."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import urllib.request
from typing import Any

import yaml

from load.canary import Answer, steady, versions_config, versions_stack
from load.etcd_server import EtcdServer
from load.stack import Stack


def metric(port: int, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"{name}{{{labels}}}"):
                return float(line.split()[-1])
    return 0.0


class Load:
    """Steady requests from 200 callers in a thread of their own, until stopped."""

    def __init__(self, url: str, rate: float = 40.0) -> None:
        self.url, self.rate = url, rate
        self.answers: list[Answer] = []
        self.thread = threading.Thread(target=self._run)
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None

    def _run(self) -> None:
        async def main() -> None:
            self.stop_event = asyncio.Event()
            self.answers = await steady(self.url, self.stop_event, self.rate)

        self.loop.run_until_complete(main())

    def __enter__(self) -> Load:
        self.thread.start()
        while self.stop_event is None:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop_event is not None
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)


def check(answers: list[Answer], changed_at: float, to: str, until: float) -> float:
    """No request failed; every request sent 2 s after the change (and before `until`) got
    version `to`. Returns the lag: how long after the change the last other version was seen."""
    assert answers and all(a.status == 200 for a in answers), [a for a in answers if a.status != 200][:3]
    before = [a for a in answers if a.at < changed_at]
    assert before and all(a.version != to for a in before)
    after = [a for a in answers if changed_at + 2.0 <= a.at < until]
    assert after and all(a.version == to for a in after), [a for a in after if a.version != to][:3]
    return max((a.at - changed_at for a in answers if a.at >= changed_at and a.version != to), default=0.0)


def test_etcd_weight_change_on_every_worker_within_2s_and_a_bad_one_refused() -> None:
    etcd = EtcdServer().start()
    try:
        config: dict[str, Any] = {**versions_config(weight=0), "sources": {"etcd": {"port": etcd.port}}}
        with versions_stack(config) as stack:
            with Load(stack.url) as load:
                time.sleep(2.0)
                changed = time.monotonic()
                etcd.put("/models/chat/traffic", "100%")
                time.sleep(3.0)
                refused_at = time.monotonic()
                etcd.put("/models/chat/traffic", "a lot")
                time.sleep(2.5)
            lag = check(load.answers, changed, "v2", time.monotonic())
            print(f"etcd: {len(load.answers)} requests, 0 failed, change in force after {lag:.2f}s")
            assert lag < 2.0
            assert all(a.version == "v2" for a in load.answers if a.at >= refused_at)  # overlay kept
            for port in stack.metrics_ports:  # both workers applied the change and refused the bad one
                assert metric(port, "gate_version_share", 'model="chat",version="v2"') == 1.0
                assert metric(port, "gate_config_source_updates_total", 'result="refused",source="etcd"') >= 1
    finally:
        etcd.kill()


def swap_config(stack: Stack, config: dict[str, Any]) -> None:
    """Replace gate.yaml at once (a new file renamed over it, as a ConfigMap's link swap does)."""
    path = stack.workdir / "gate.yaml"
    current = yaml.safe_load(path.read_text())
    current["routing"] = config["routing"]
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump(current))
    os.replace(tmp, path)


def test_watched_file_weight_change_within_2s_and_a_broken_file_refused() -> None:
    config: dict[str, Any] = {**versions_config(weight=0), "sources": {"watch_file_s": 0.5}}
    with versions_stack(config) as stack:
        with Load(stack.url) as load:
            time.sleep(2.0)
            changed = time.monotonic()
            swap_config(stack, versions_config(weight=100))
            time.sleep(3.0)
            broken = time.monotonic()
            path = stack.workdir / "gate.yaml"
            tmp = path.with_suffix(".new")
            tmp.write_text(path.read_text().replace("weight: 100", "weight: lots"))
            os.replace(tmp, path)
            time.sleep(2.5)
        lag = check(load.answers, changed, "v2", time.monotonic())
        print(f"file: {len(load.answers)} requests, 0 failed, change in force after {lag:.2f}s")
        assert lag < 2.0
        assert all(a.version == "v2" for a in load.answers if a.at >= broken)
        for port in stack.metrics_ports:
            assert metric(port, "gate_config_reloads_total", 'result="done"') >= 1
            assert metric(port, "gate_config_reloads_total", 'result="refused"') >= 1
        assert "weight" in stack.log("gate") and "not reloaded" in stack.log("gate")
