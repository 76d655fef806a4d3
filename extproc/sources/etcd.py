"""An etcd key prefix overlaid on `routing.versions`, watched (the seed's layout).

    {prefix}{model}/version  → "v2"   the stable version (naming the canary gives it everyone)
    {prefix}{model}/traffic  → "15%"  the canary's share

Every process keeps its own watch, off the request path: an event rebuilds the whole
overlay from the keys it knows, validates it against the running routing, and swaps it in
at once (`Traffic.set_etcd`) or refuses it whole, counted, the previous one kept. A lost
connection is re-opened after `retry_s`, from a fresh read of the prefix.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aetcd

from ..config import Routing
from ..metrics import Metrics
from ..versions.settings import Etcd
from ..versions.traffic import Override, Traffic

log = logging.getLogger("llm_gate.sources.etcd")
FIELDS = ("version", "traffic")


def parse_traffic(text: str) -> float:
    """"15%", "15" or "15.5 %" → 15.0; anything else, or outside 0–100, is a ValueError."""
    value = float(text.strip().removesuffix("%").strip())
    if not 0 <= value <= 100:
        raise ValueError(f"{text!r} is not a share between 0% and 100%")
    return value


def overlay(keys: dict[str, str], prefix: str, routing: Routing) -> tuple[dict[str, Override], list[str]]:
    """The overrides these keys say, and every problem with them (any problem: refuse all).

    Keys under the prefix that are not `{model}/version` or `{model}/traffic` belong to
    someone else and are left alone.
    """
    found: dict[str, dict[str, str]] = {}
    for key, value in keys.items():
        model, _, name = key.removeprefix(prefix).rpartition("/")
        if key.startswith(prefix) and model and name in FIELDS:
            found.setdefault(model, {})[name] = value
    overrides: dict[str, Override] = {}
    problems: list[str] = []
    for model, fields in sorted(found.items()):
        where = f"{prefix}{model}"
        versioned = routing.versions.get(model)
        if versioned is None:
            problems.append(f"{where}: {model!r} is not a model under routing.versions")
            continue
        stable = fields.get("version")
        if stable is not None and versioned.named(stable.strip()) is None:
            known = ", ".join(v.name for v in versioned.versions)
            problems.append(f"{where}/version: {stable!r} is not one of its versions ({known})")
            continue
        traffic = None
        if "traffic" in fields:
            if versioned.canary is None:
                problems.append(f"{where}/traffic: the model has no canary version")
                continue
            try:
                traffic = parse_traffic(fields["traffic"])
            except ValueError:
                problems.append(f"{where}/traffic: {fields['traffic']!r} is not a share like \"15%\"")
                continue
        overrides[model] = Override(stable.strip() if stable else None, traffic)
    return overrides, problems


class EtcdSource:
    def __init__(
        self, config: Etcd, traffic: Traffic, routing: Callable[[], Routing], metrics: Metrics
    ) -> None:
        self.config = config
        self.traffic = traffic
        self.routing = routing  # the running routing, read at each change (reloads replace it)
        self.metrics = metrics
        self.keys: dict[str, str] = {}

    def apply(self) -> bool:
        """Validate the keys known now and swap the overlay in; False (counted) when refused."""
        overrides, problems = overlay(self.keys, self.config.prefix, self.routing())
        if problems:
            self.metrics.config_source_updates.labels("etcd", "refused").inc()
            log.error("etcd change refused; keeping the running overlay:\n%s", "\n".join(problems))
            return False
        self.traffic.set_etcd(overrides)
        self.metrics.config_source_updates.labels("etcd", "applied").inc()
        log.info("etcd overlay applied: %s", overrides or "none")
        return True

    async def run(self) -> None:
        """Read the prefix, then follow its changes; reconnect on any failure. Until cancelled."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.background_errors.labels("etcd_watch").inc()
                log.warning("etcd %s:%d: %r; retrying in %gs", self.config.host, self.config.port, exc,
                            self.config.retry_s)
            await asyncio.sleep(self.config.retry_s)

    async def _follow(self) -> None:
        c = self.config
        prefix = c.prefix.encode()
        client = aetcd.Client(host=c.host, port=c.port, timeout=c.timeout_s)
        try:
            await client.connect()
            snapshot = await client.get_prefix(prefix)
            self.keys = {kv.key.decode(): kv.value.decode() for kv in snapshot}
            self.apply()
            watch = await client.watch_prefix(prefix, start_revision=snapshot.header.revision + 1)
            try:
                async for event in watch:
                    key = event.kv.key.decode()
                    if event.kind == aetcd.EventKind.DELETE:
                        self.keys.pop(key, None)
                    else:
                        self.keys[key] = event.kv.value.decode()
                    self.apply()
            finally:
                await _settled(watch.cancel(), c.timeout_s)
        finally:
            if not await _settled(client.close(), c.timeout_s) and client.channel is not None:
                await client.channel.close()  # grpc's own close cancels what is left at once


async def _settled(cleanup: Awaitable[None], timeout_s: float) -> bool:
    """An aetcd clean-up, at most `timeout_s`: its watcher puts requests on a queue of 10 that
    nothing reads once the stream has died under it (an etcd restart) and can wait there for
    good; a stop or a reconnect must not (once a test's cancel hung 300 s). False when it failed
    or timed out."""
    try:
        await asyncio.wait_for(cleanup, timeout_s)
    except Exception:
        return False
    return True
