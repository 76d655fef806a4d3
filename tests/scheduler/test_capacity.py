"""Capacity: the seed's rule, the limit it yields per source, and the readers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import aiohttp
import pytest

from extproc.scheduler.capacity import (
    GB,
    Limit,
    Reader,
    Reading,
    VllmLoad,
    avg_prompt_vram_gb,
    load_nvml,
    next_limit,
    nvml_reading,
    parse_vllm_metrics,
    room,
    scaled,
    target_batch,
    vllm_reading,
)
from extproc.scheduler.settings import Capacity
from load.vllm_sim import SimConfig, start_sim

S = Capacity()


@pytest.mark.parametrize(
    ("tokens", "gb"), [(0, 1.2), (512, 1.2), (513, 2.8), (2048, 2.8), (2049, 4.5), (100_000, 4.5)]
)
def test_avg_prompt_vram_by_prompt_length(tokens: int, gb: float) -> None:
    assert avg_prompt_vram_gb(S, tokens) == gb


@pytest.mark.parametrize(
    ("total", "kv", "tokens", "batch"),
    [
        (80, 20, 300, 30),  # (80*0.7 - 20) / 1.2
        (80, 20, 1000, 12),  # (56 - 20) / 2.8
        (80, 20, 4000, 8),  # (56 - 20) / 4.5
        (80, 60, 300, 1),  # over the line: never below one
        (141, 0, 100, 64),  # an H200, empty: capped
    ],
)
def test_seed_rule(total: float, kv: float, tokens: int, batch: int) -> None:
    assert target_batch(S, room(S, total, kv, avg_prompt_vram_gb(S, tokens))) == batch


def vllm(running: int, waiting: int, usage: float, at: float = 0.0) -> Reading:
    return vllm_reading(S, [VllmLoad(running, waiting, usage)], 256, at)


LAST4 = Limit(4, False, "vllm", 0.0, 0.2, reading_at=-1.0)
LIMIT_CASES = [
    ("no reading yet: static", None, 0, None, 1.0, (16, False, "static")),
    ("vLLM queues: hold what it runs", vllm(4, 3, 0.2), 9, LAST4, 0.1, (4, False, "vllm")),
    ("vLLM first reading: what runs plus a step", vllm(2, 0, 0.1), 3, None, 0.0, (5, False, "vllm")),
    ("vLLM all slots used, none queued: probe up", vllm(4, 0, 0.2), 4, LAST4, 0.0, (6, False, "vllm")),
    (
        "vLLM queued a moment ago: no probe",
        vllm(4, 0, 0.2),
        4,
        replace(LAST4, queued_at=-0.5),
        0.0,
        (4, False, "vllm"),
    ),
    ("vLLM slots to spare: keep", vllm(2, 0, 0.1), 2, LAST4, 0.0, (4, False, "vllm")),
    ("same reading again: unchanged", vllm(4, 0, 0.2, at=-1.0), 4, LAST4, 0.0, (4, False, "vllm")),
    ("vLLM KV over the line: hold", vllm(6, 0, 0.75), 6, LAST4, 0.0, (6, False, "vllm")),
    ("vLLM pressure", vllm(6, 0, 0.9), 6, None, 0.0, (6, True, "vllm")),
    (
        "stale: saturated, not zero",
        vllm(4, 0, 0.2, at=0.0),
        4,
        Limit(12, False, "vllm", 0.0),
        5.0,
        (12, True, "stale"),
    ),
    (
        "nvml: in flight plus the batch",
        Reading("nvml", 0.0, 0.5, room(S, 80, 20, 1.2)),
        5,
        None,
        0.0,
        (35, False, "nvml"),
    ),
    ("nvml: no room", Reading("nvml", 0.0, 0.9, -3.0), 5, None, 0.0, (5, True, "nvml")),
]


@pytest.mark.parametrize(
    ("case", "reading", "in_flight", "last", "now", "expected"), LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES]
)
def test_next_limit(
    case: str,
    reading: Reading | None,
    in_flight: int,
    last: Limit | None,
    now: float,
    expected: tuple[int, bool, str],
) -> None:
    got = next_limit(S, reading, in_flight, last, now)
    assert (got.limit, got.pressure, got.source) == expected


@pytest.mark.parametrize(("factor", "limit"), [(1.0, 10), (0.5, 5), (0.01, 1), (0.0, 0), (3.0, 10)])
def test_breaker_factor_scales_the_limit(factor: float, limit: int) -> None:
    assert scaled(Limit(10, False, "vllm", 0.0), factor).limit == limit


METRICS = """# HELP vllm:num_requests_running Running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="a"} 0.4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:kv_cache_usage_perc{model_name="b"} 0.5
"""


def test_parse_vllm_metrics_sums_models_and_prefers_the_new_kv_name() -> None:
    assert parse_vllm_metrics(METRICS) == VllmLoad(running=4, waiting=2, kv_usage=0.5)
    old_only = "\n".join(line for line in METRICS.splitlines() if "kv_cache_usage" not in line)
    assert parse_vllm_metrics(old_only).kv_usage == 0.4


@dataclass
class Memory:
    total: int
    used: int
    free: int = 0


class FakeNvml:
    def __init__(self, devices: dict[int, Memory]) -> None:
        self.devices = devices
        self.broken = False

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if self.broken:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:  # noqa: N802
        return self.devices[handle]


async def test_nvml_source_reads_memory_of_the_listed_gpus_and_goes_stale_when_lost() -> None:
    settings = Capacity(nvml_devices=[0, 1], nvml_baseline_gb=16)
    nvml = FakeNvml({0: Memory(80 * GB, 36 * GB), 1: Memory(80 * GB, 36 * GB), 2: Memory(80 * GB, 80 * GB)})
    now = [0.0]
    reader = Reader(settings, lambda: now[0], nvml=nvml)
    assert reader.source == "nvml"
    reading = await reader.read(prompt_tokens=300)
    assert reading is not None and reading.memory_used == pytest.approx(0.45)
    # Two GPUs: 160 GB * 0.7 - (72 - 2*16) GB of KV = 72 GB of room at 1.2 GB a prompt.
    assert reading.room == pytest.approx(60.0)
    limit = next_limit(settings, reading, 4, None, 0.0)
    assert (limit.limit, limit.source, limit.pressure) == (4 + 60, "nvml", False)
    nvml.broken = True
    now[0] = 3.0
    assert await reader.read(prompt_tokens=300) is None
    stale = next_limit(settings, reading, 4, limit, now[0])
    assert stale.source == "stale" and stale.limit == limit.limit and stale.pressure


async def test_vllm_source_against_the_simulator() -> None:
    sims = [
        await start_sim(SimConfig(max_num_seqs=2, base_ttft_ms=3000, kv_cache_tokens=1000)) for _ in range(2)
    ]
    settings = Capacity(metrics_urls=[f"{s.url}/metrics" for s in sims], kv_cache_gb=10)
    reader = Reader(settings, lambda: 1.0)
    assert reader.source == "vllm"
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "word " * 90}], "max_tokens": 10}
    async with aiohttp.ClientSession() as session:
        calls = [
            asyncio.create_task(session.post(f"{sims[0].url}/v1/chat/completions", json=body))
            for _ in range(3)
        ]
        try:
            for _ in range(100):
                reading = await reader.read(prompt_tokens=100)
                assert reading is not None
                if reading.running == 2 and reading.waiting == 1:
                    break
                await asyncio.sleep(0.02)
            assert reading is not None and (reading.running, reading.waiting) == (2, 1)
            assert reading.memory_used == pytest.approx(0.2)  # 2 x 100 of 1000 KV tokens on the busy one
            assert next_limit(settings, reading, 3, None, 1.0).limit == 2  # what it runs
        finally:
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
    whole = await reader.read(prompt_tokens=100)
    await sims[1].close()
    # One endpoint gone (a pod going away): the reading is the other's room alone, never more.
    half = await reader.read(prompt_tokens=100)
    assert whole is not None and half is not None and 0 < half.room < whole.room
    await sims[0].close()
    assert await reader.read(prompt_tokens=100) is None  # none answers: no reading
    await reader.close()


def test_nvml_for_real_when_a_gpu_is_present() -> None:
    nvml = load_nvml()
    if nvml is None:
        pytest.skip("no NVIDIA driver or GPU here")
    settings = Capacity(nvml_devices=[0])
    reading = nvml_reading(settings, nvml, 300, 0.0)
    assert 0.0 < reading.memory_used <= 1.0
    assert next_limit(settings, reading, 0, None, 0.0).limit >= 1


PROVEN_CASES = [
    ("never queued: no slot in doubt", vllm(4, 0, 0.2), 4, LAST4, (6, None, 0)),
    ("queues: what it runs is proven", vllm(4, 3, 0.2), 9, LAST4, (4, 4, 0)),
    (
        "a probe a step above what it ran when it queued",
        vllm(4, 0, 0.2),
        4,
        replace(LAST4, proven=4),
        (6, 4, 2),
    ),
    (
        "ran more with nothing queued: proven rises",
        vllm(5, 0, 0.2),
        5,
        replace(LAST4, limit=6, proven=4),
        (6, 5, 1),
    ),
]


@pytest.mark.parametrize(
    ("case", "reading", "in_flight", "last", "expected"), PROVEN_CASES, ids=[c[0] for c in PROVEN_CASES]
)
def test_slots_above_what_the_pool_ran_without_queueing_are_probes(
    case: str, reading: Reading, in_flight: int, last: Limit, expected: tuple[int, int | None, int]
) -> None:
    got = next_limit(S, reading, in_flight, last, 0.0)
    assert (got.limit, got.proven, got.probing) == expected


async def test_pods_behind_a_headless_service_are_found_by_dns_and_a_gone_one_voids_nothing() -> None:
    """`metrics_dns` resolves a name to every pod (here `localhost` → 127.0.0.1); a pod that
    does not answer (a second URL to a closed port) leaves the others' reading standing."""
    sim = await start_sim(SimConfig(max_num_seqs=2, kv_cache_tokens=1000))
    try:
        from load.stack import free_port

        settings = Capacity(
            metrics_dns=f"localhost:{sim.port}",
            metrics_urls=[f"http://127.0.0.1:{free_port()}/metrics"],
            kv_cache_gb=10,
        )
        reader = Reader(settings, lambda: 1.0)
        assert reader.source == "vllm"
        reading = await reader.read(prompt_tokens=100)
        assert reading is not None and reading.source == "vllm" and reading.running == 0
        none_answer = Reader(Capacity(metrics_urls=settings.metrics_urls, kv_cache_gb=10), lambda: 1.0)
        assert await none_answer.read(prompt_tokens=100) is None
        await reader.close()
        await none_answer.close()
    finally:
        await sim.close()
