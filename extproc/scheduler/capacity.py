"""How many requests a pool may hold now: live readings turned into a slot limit.

Sources, best first: GPU memory via NVML (when the scheduler runs beside the GPUs), each
endpoint's vLLM `/metrics`, and a static limit. The seed's rule sizes the batch:

    target_batch = max(1, min(64, (total_vram * 0.7 - current_kv_cache) / avg_prompt_vram))

with avg_prompt_vram by prompt length (<=512 tokens 1.2 GB, <=2048 2.8 GB, above 4.5 GB).

NVML: total_vram and used memory are summed over the listed GPUs; current_kv_cache is
used memory minus `nvml_baseline_gb` (weights and runtime). Servers that preallocate
their KV cache (vLLM does) show a constant used memory: use the vLLM source for them.
The limit is our in-flight count plus target_batch while there is room under the line,
and our in-flight count (at least 1) once there is none.

vLLM: the KV-cache pool is the "total": total_vram = 1, current_kv_cache =
`vllm:kv_cache_usage_perc`, avg_prompt_vram = avg_prompt_gb / kv_cache_gb. So the same
rule keeps KV use under 70 % of the pool, leaving the rest for the decode growth of
what runs. vLLM also says how many requests it runs and queues: while it queues any,
the limit is what it runs plus one (one request ready at every completion, never a
queue of ours inside vLLM); while it queues none, the limit may grow by
min(target_batch, ramp) per reading.

Above `pressure_above` memory use the queue releases only requests that have waited
`pressure_hold_ms`. A reading older than `stale_after_ms` means "saturated but not
zero": the last limit is kept (at least 1) and pressure is on.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, cast

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .settings import Capacity as Settings

GB = 1024**3
Source = Literal["nvml", "vllm", "static", "stale"]


@dataclass(frozen=True)
class Reading:
    source: Literal["nvml", "vllm"]
    at: float
    memory_used: float  # 0..1 of what the rule calls total (GPU memory, or the KV pool)
    room: float  # (total * vram_fraction - used) / avg_prompt_vram, before clamping
    running: int = 0
    waiting: int = 0


@dataclass(frozen=True)
class Limit:
    limit: int
    pressure: bool
    source: Source
    age_s: float
    memory_used: float = 0.0
    reading_at: float | None = None  # the reading it came from
    queued_at: float | None = None  # the last reading in which vLLM queued requests
    # Slots the pool has been seen to run without queueing, since it last queued (None: it never
    # queued, so no slot is in doubt). Slots above it are probes: vLLM may queue what they admit.
    proven: int | None = None

    @property
    def probing(self) -> int:
        """Slots of `limit` above what the pool has been seen to run without queueing."""
        return 0 if self.proven is None else max(0, self.limit - self.proven)


def avg_prompt_vram_gb(settings: Settings, prompt_tokens: float) -> float:
    for band in settings.prompt_vram_gb:
        if band.max_tokens is None or prompt_tokens <= band.max_tokens:
            return band.vram_gb
    return settings.prompt_vram_gb[-1].vram_gb


def room(settings: Settings, total: float, used: float, prompt_vram: float) -> float:
    return (total * settings.vram_fraction - used) / prompt_vram


def target_batch(settings: Settings, room: float) -> int:
    return max(1, min(settings.max_batch, math.floor(room)))


def next_limit(
    settings: Settings, reading: Reading | None, in_flight: int, last: Limit | None, now: float
) -> Limit:
    """The limit for the next refresh period, from the latest good reading."""
    if reading is None:
        return Limit(settings.static_limit, False, "static", 0.0)
    age = now - reading.at
    if age > settings.stale_after_ms / 1000:
        kept = max(1, last.limit if last is not None else settings.static_limit)
        used, proven = (last.memory_used, last.proven) if last else (1.0, None)
        return Limit(kept, True, "stale", age, used, reading.at, proven=proven)
    if last is not None and last.reading_at == reading.at and last.source == reading.source:
        return replace(last, age_s=age)  # nothing new since the last refresh
    pressure = reading.memory_used > settings.pressure_above
    batch = target_batch(settings, reading.room)
    queued_at = proven = None
    if reading.source == "vllm":
        previous = last if last is not None and last.source == "vllm" else None
        limit = vllm_limit(settings, reading, in_flight, previous, batch)
        queued_at = reading.at if reading.waiting > 0 else previous.queued_at if previous else None
        proven = proven_slots(reading, previous.proven if previous else None)
    else:
        limit = in_flight + batch if reading.room > 0 else max(1, in_flight)
    limit = max(1, limit)
    return Limit(limit, pressure, reading.source, age, reading.memory_used, reading.at, queued_at, proven)


def proven_slots(reading: Reading, proven: int | None) -> int | None:
    """What the pool runs without queueing: what it ran when it last queued, raised each time it
    is seen running more with nothing queued."""
    if reading.waiting > 0:
        return max(1, reading.running)
    if proven is not None and reading.running > proven:
        return reading.running
    return proven


def vllm_limit(settings: Settings, reading: Reading, in_flight: int, last: Limit | None, batch: int) -> int:
    if reading.waiting > 0:  # it cannot run all it has: hold what it runs
        return max(1, reading.running)
    if reading.room <= 0:  # KV cache over the line: no more than now
        return max(1, reading.running)
    if last is None:  # the first reading: start from what runs, plus a step
        return max(reading.running, in_flight) + min(batch, settings.ramp)
    settled = last.queued_at is None or reading.at - last.queued_at >= settings.probe_hold_ms / 1000
    if in_flight >= last.limit and settled:  # all slots used, vLLM queues none: probe a step up
        return last.limit + min(batch, settings.ramp)
    return last.limit


def scaled(limit: Limit, factor: float) -> Limit:
    """Apply the breaker's adaptive factor (0..1); only 0 closes the pool entirely."""
    factor = min(1.0, max(0.0, factor))
    value = 0 if factor == 0 else max(1, math.floor(limit.limit * factor))
    return replace(limit, limit=value)


# -- vLLM /metrics --------------------------------------------------------------------------

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, then the old one


@dataclass(frozen=True)
class VllmLoad:
    running: int
    waiting: int
    kv_usage: float


def parse_vllm_metrics(text: str) -> VllmLoad:
    """Sum running and waiting over models; the highest KV usage of any model."""
    running = waiting = 0.0
    usage: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_running":
                running += sample.value
            elif sample.name == "vllm:num_requests_waiting":
                waiting += sample.value
            elif sample.name in KV_USAGE:
                usage[sample.name] = max(usage.get(sample.name, 0.0), sample.value)
    kv = next((usage[name] for name in KV_USAGE if name in usage), 0.0)
    return VllmLoad(int(running), int(waiting), min(1.0, max(0.0, kv)))


def vllm_reading(settings: Settings, loads: list[VllmLoad], prompt_tokens: float, now: float) -> Reading:
    """Each endpoint's room under the rule, summed; memory use is the fullest endpoint's."""
    share = avg_prompt_vram_gb(settings, prompt_tokens) / settings.kv_cache_gb
    return Reading(
        source="vllm",
        at=now,
        memory_used=max(load.kv_usage for load in loads),
        room=sum(max(0.0, room(settings, 1.0, load.kv_usage, share)) for load in loads),
        running=sum(load.running for load in loads),
        waiting=sum(load.waiting for load in loads),
    )


async def endpoint_urls(settings: Settings) -> list[str]:
    """The configured /metrics URLs, and one per address the headless Service resolves to."""
    urls = list(settings.metrics_urls)
    if settings.metrics_dns:
        host, _, port = settings.metrics_dns.rpartition(":")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except (OSError, ValueError):
            infos = []
        for address in sorted({str(info[4][0]) for info in infos}):
            shown = f"[{address}]" if ":" in address else address
            urls.append(f"http://{shown}:{port}/metrics")
    return urls


async def read_vllm(session: aiohttp.ClientSession, settings: Settings) -> list[VllmLoad] | None:
    """The load of every endpoint that answered in time; None when none did. An endpoint that
    is going away does not void the others' readings: the room counted is theirs alone."""

    timeout = settings.timeout_ms / 1000

    async def one(url: str) -> VllmLoad | None:
        try:
            async with asyncio.timeout(timeout), session.get(url) as response:
                response.raise_for_status()
                return parse_vllm_metrics(await response.text())
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
            return None

    try:
        async with asyncio.timeout(timeout):
            urls = await endpoint_urls(settings)
    except TimeoutError:
        return None
    loads = [load for load in await asyncio.gather(*map(one, urls)) if load is not None]
    return loads or None


# -- NVML -----------------------------------------------------------------------------------


class Nvml(Protocol):
    """The part of `pynvml` (nvidia-ml-py) we use; tests pass a fake."""

    def nvmlInit(self) -> None: ...  # noqa: N802
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: N802
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # noqa: N802


def load_nvml() -> Nvml | None:
    """The real binding, initialised; None when there is no driver or no GPU."""
    try:
        pynvml = cast(Nvml, importlib.import_module("pynvml"))
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def nvml_reading(settings: Settings, nvml: Nvml, prompt_tokens: float, now: float) -> Reading:
    total = used = 0
    for index in settings.nvml_devices:
        info = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index))
        total += int(info.total)
        used += int(info.used)
    kv_gb = max(0.0, used / GB - settings.nvml_baseline_gb * len(settings.nvml_devices))
    return Reading(
        source="nvml",
        at=now,
        memory_used=used / total if total else 1.0,
        room=room(settings, total / GB, kv_gb, avg_prompt_vram_gb(settings, prompt_tokens)),
    )


def choose_source(settings: Settings, nvml: Nvml | None) -> Literal["nvml", "vllm", "static"]:
    if settings.source != "auto":
        return settings.source
    if settings.nvml_devices and nvml is not None:
        return "nvml"
    return "vllm" if settings.metrics_urls or settings.metrics_dns else "static"


class Reader:
    """Takes one reading from the configured source; the scheduler calls it every refresh."""

    def __init__(
        self, settings: Settings, clock: Callable[[], float], nvml: Nvml | None = None, load: bool = True
    ) -> None:
        self.settings = settings
        self.clock = clock
        want_nvml = settings.source in ("auto", "nvml") and bool(settings.nvml_devices)
        self.nvml = nvml if nvml is not None or not (want_nvml and load) else load_nvml()
        self.source = choose_source(settings, self.nvml)
        self._session: aiohttp.ClientSession | None = None

    async def read(self, prompt_tokens: float) -> Reading | None:
        if self.source == "nvml" and self.nvml is not None:
            now = self.clock()
            try:
                return await asyncio.to_thread(nvml_reading, self.settings, self.nvml, prompt_tokens, now)
            except Exception:
                return None
        if self.source == "vllm":
            if self._session is None:
                self._session = aiohttp.ClientSession()
            loads = await read_vllm(self._session, self.settings)
            return None if not loads else vllm_reading(self.settings, loads, prompt_tokens, self.clock())
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
