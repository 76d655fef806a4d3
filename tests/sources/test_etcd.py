"""The etcd overlay: a pure check of the keys, and a real etcd 3.4 watched by the source."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from extproc.config import parse_config
from extproc.metrics import Metrics
from extproc.sources.etcd import EtcdSource, overlay, parse_traffic
from extproc.versions.settings import Etcd
from extproc.versions.traffic import Override, Traffic
from load.etcd_server import EtcdServer

ROUTING = parse_config(
    """
routing:
  pools: {a: {cluster: a}, b: {cluster: b}, c: {cluster: c}}
  models: {}
  default_pool: null
  versions:
    chat:
      versions: [{name: v1, pool: a, weight: 100}, {name: v2, pool: b, canary: true}]
    plain:
      versions: [{name: only, pool: c, weight: 1}]
"""
).routing
P = "/models/"


@pytest.mark.parametrize(
    ("text", "value"), [("15%", 15.0), ("15", 15.0), (" 2.5 % ", 2.5), ("0%", 0.0), ("100%", 100.0)]
)
def test_parse_traffic(text: str, value: float) -> None:
    assert parse_traffic(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1%", "101%", "15%%"])
def test_parse_traffic_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_traffic(text)


@pytest.mark.parametrize(
    ("keys", "expected", "problem"),
    [
        ({}, {}, None),
        ({P + "chat/traffic": "15%"}, {"chat": Override(None, 15.0)}, None),
        ({P + "chat/version": "v2", P + "chat/traffic": "5"}, {"chat": Override("v2", 5.0)}, None),
        ({P + "chat/owner": "team-a", "/other/x": "1"}, {}, None),  # not ours: left alone
        ({P + "chat/traffic": "half"}, None, "chat/traffic"),
        ({P + "chat/version": "v9"}, None, "not one of its versions"),
        ({P + "nope/traffic": "5%"}, None, "not a model under routing.versions"),
        ({P + "plain/traffic": "5%"}, None, "no canary"),
    ],
)
def test_overlay_from_keys(
    keys: dict[str, str], expected: dict[str, Override] | None, problem: str | None
) -> None:
    overrides, problems = overlay(keys, P, ROUTING)
    if problem is None:
        assert problems == [] and overrides == expected
    else:
        assert any(problem in p for p in problems)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.kill()


async def until(check: object, within_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if check():  # type: ignore[operator]
            return time.monotonic() - started
        await asyncio.sleep(0.01)
    raise AssertionError("not within the time")


async def test_a_real_etcd_change_is_applied_at_once_and_a_bad_one_refused(etcd: EtcdServer) -> None:
    await asyncio.to_thread(etcd.put, P + "chat/traffic", "5%")
    traffic, metrics = Traffic(), Metrics()
    source = EtcdSource(Etcd(port=etcd.port, prefix=P, retry_s=0.2), traffic, lambda: ROUTING, metrics)
    task = asyncio.get_running_loop().create_task(source.run())
    try:
        await until(lambda: traffic.etcd.get("chat") == Override(None, 5.0), 5)  # read at start
        await asyncio.to_thread(etcd.put, P + "chat/traffic", "15%")
        took = await until(lambda: traffic.etcd.get("chat") == Override(None, 15.0), 2)
        assert took < 2
        await asyncio.to_thread(etcd.put, P + "chat/traffic", "fifteen")
        refused = metrics.registry.get_sample_value
        labels = {"source": "etcd", "result": "refused"}
        await until(lambda: refused("gate_config_source_updates_total", labels), 2)
        assert traffic.etcd == {"chat": Override(None, 15.0)}  # the running overlay stays
        await asyncio.to_thread(etcd.put, P + "chat/traffic", "25%")
        await asyncio.to_thread(etcd.put, P + "chat/version", "v2")
        await until(lambda: traffic.etcd.get("chat") == Override("v2", 25.0), 2)
        await asyncio.to_thread(etcd.delete, P + "chat/version")
        await until(lambda: traffic.etcd.get("chat") == Override(None, 25.0), 2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)  # a stop that hangs fails here, not at the suite's time-out
        await asyncio.to_thread(etcd.delete, P + "chat/traffic")


async def test_the_watch_comes_back_after_etcd_restarts(etcd: EtcdServer) -> None:
    traffic, metrics = Traffic(), Metrics()
    settings = Etcd(port=etcd.port, prefix=P, retry_s=0.2, timeout_s=1)
    source = EtcdSource(settings, traffic, lambda: ROUTING, metrics)
    task = asyncio.get_running_loop().create_task(source.run())
    try:
        await asyncio.to_thread(etcd.put, P + "chat/traffic", "10%")
        await until(lambda: traffic.etcd.get("chat") == Override(None, 10.0), 5)
        assert etcd.proc is not None
        etcd.proc.kill()
        etcd.proc.wait(5)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(restart, etcd)
        await asyncio.to_thread(etcd.put, P + "chat/traffic", "20%")
        await until(lambda: traffic.etcd.get("chat") == Override(None, 20.0), 10)
        assert traffic.etcd["chat"].traffic == 20.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)  # a stop that hangs fails here, not at the suite's time-out
        await asyncio.to_thread(etcd.delete, P + "chat/traffic")


def restart(etcd: EtcdServer) -> None:
    """The same data directory and ports: etcd comes back with its keys."""
    import subprocess

    etcd.proc = subprocess.Popen(etcd.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            etcd.put("/llm-gate/ping", "1")
            return
        except Exception:
            time.sleep(0.1)
    raise TimeoutError("etcd did not come back")


async def test_the_source_stops_at_once_when_etcd_is_gone(etcd: EtcdServer) -> None:
    """A gate stopping while etcd is down: cancelling the watch returns within the client's
    time-out, whatever aetcd's own clean-up waits for."""
    settings = Etcd(port=etcd.port, prefix=P, retry_s=0.2, timeout_s=1)
    source = EtcdSource(settings, Traffic(), lambda: ROUTING, Metrics())
    task = asyncio.get_running_loop().create_task(source.run())
    await asyncio.to_thread(etcd.put, P + "chat/traffic", "10%")
    await until(lambda: source.keys.get(P + "chat/traffic") == "10%", 5)
    assert etcd.proc is not None
    etcd.proc.kill()
    etcd.proc.wait(5)
    for _ in range(30):  # watches re-made and dropped while etcd is away
        await asyncio.sleep(0.1)
    started = time.monotonic()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert time.monotonic() - started < 3
    await asyncio.to_thread(restart, etcd)
