"""Benchmark: how long one big prompt holds the gate's event loop, in process, no network.

The gate's own pipeline (every stage, semantic layer off) handles ~512 KB prompts one after
another, each a new question, answered by a fixed upstream reply; a heartbeat coroutine ticks
every 0.5 ms meanwhile. The longest gap between two ticks, in the loop thread's CPU time, is
the longest every other stream on that worker would have waited for this prompt's work. Same
for a small prompt, in the same run, as the floor. Two variants: a pool that takes the prompt
(counted in full) and one whose limit it passes (422). Writes load/results/bench_stall.md.

    python -m load.bench_stall [--prompts 10] [--kb 512]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

import orjson
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.app import build_pipeline
from extproc.config import parse_config
from extproc.metrics import Metrics
from extproc.server import Session

from .prose import document

RESULTS = Path(__file__).parent / "results" / "bench_stall.md"
TICK_S = 0.0005
ANSWER = (
    b'{"id":"x","object":"chat.completion","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
)
POST = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
TAKES_IT = {"cache": {"semantic": {"enabled": False}}, "validation": {"max_prompt_tokens": 200_000}}
OVER_LIMIT = {"cache": {"semantic": {"enabled": False}}}


def headers(values: dict[str, str]) -> pb.HttpHeaders:
    return pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
        )
    )


def prompt(kb: int, rng: random.Random) -> str:
    return document(kb * 1024, rng)


async def one_exchange(pipeline: Any, text: str, history: list[dict[str, str]] | None = None) -> int:
    """Headers, body, the upstream's answer: what Envoy sends for one request. The status the gate
    answered with (200: passed on to the upstream)."""
    body = orjson.dumps(
        {"model": "llama-3-8b", "max_tokens": 16,
         "messages": [*(history or []), {"role": "user", "content": text}]}
    )
    session = Session(pipeline)
    status = 200
    messages = [
        pb.ProcessingRequest(request_headers=headers({**POST, "content-length": str(len(body))})),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(
            response_headers=headers({":status": "200", "content-type": "application/json"})
        ),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=ANSWER, end_of_stream=True)),
    ]
    try:
        for message in messages:
            for response in await session.handle(message):
                if response.WhichOneof("response") == "immediate_response":
                    status = response.immediate_response.status.code
            if status != 200:
                break
    finally:
        await session.close()
    return status


async def stalls(
    config: dict[str, Any], texts: list[str], history: list[dict[str, str]] | None = None
) -> dict[str, float]:
    """The event loop's CPU per prompt (a pass alone), then the longest gaps between heartbeats
    (a second pass): in the thread's CPU time, which the machine's other load does not lengthen,
    and in wall time."""
    pipeline = build_pipeline(parse_config(yaml.safe_dump(config)), Metrics())
    assert pipeline.services is not None
    await pipeline.services.start()
    cpu_gaps: list[float] = []
    wall_gaps: list[float] = []
    running = True

    async def heartbeat() -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        while running:
            await asyncio.sleep(TICK_S)
            now, now_cpu = time.perf_counter(), time.thread_time()
            wall_gaps.append(now - wall)
            cpu_gaps.append(now_cpu - cpu)
            wall, cpu = now, now_cpu

    await one_exchange(pipeline, texts[0][:100] + " warm-up")  # first-use costs out of the figure
    await one_exchange(pipeline, texts[0] + " warm-up", history)  # and a history's first count
    started, cpu = time.perf_counter(), time.thread_time()
    statuses = [await one_exchange(pipeline, t + " first pass", history) for t in texts]
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.05)
    cpu_gaps.clear()
    wall_gaps.clear()
    for t in texts:
        await one_exchange(pipeline, t + " second pass", history)
    running = False
    await beat
    await pipeline.aclose()
    return {
        "cpu_stall_ms": 1000 * max(cpu_gaps),
        "wall_stall_ms": 1000 * max(wall_gaps),
        "wall_ms": 1000 * wall / len(texts),
        "loop_cpu_ms": 1000 * cpu / len(texts),
        "status": statuses[-1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--kb", type=int, default=512)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    big = [prompt(args.kb, rng) for _ in range(args.prompts)]
    small = [f"question {i} of {rng.randrange(10**9)}" for i in range(args.prompts)]
    # A conversation of ~512 KB that goes on: the earlier turns come again with each question.
    turns = [prompt(args.kb // 32, rng) for _ in range(32)]
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    rows = [
        ("small prompt", stalls(TAKES_IT, small)),
        (f"{args.kb} KB prompt, counted in full", stalls(TAKES_IT, big)),
        (f"{args.kb} KB prompt, over the limit (422)", stalls(OVER_LIMIT, big)),
        (f"{args.kb} KB conversation, a new question after turns seen before",
         stalls(TAKES_IT, small, history)),
    ]
    lines = [
        f"# Event-loop stalls per prompt ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m load.bench_stall --prompts {args.prompts} --kb {args.kb}`: the gate's pipeline in "
        f"process (every stage, semantic off), {args.prompts} prompts one after another, a heartbeat "
        f"every {TICK_S * 1000:g} ms. The longest gap between ticks in the loop thread's CPU time is the "
        "longest any other stream waited for this prompt's work (the wall-time gap adds whatever else "
        "the machine ran meanwhile).",
        "",
        "| prompt | status | longest loop stall, CPU ms | longest tick gap, wall ms "
        "| event-loop CPU ms/prompt | wall ms/prompt |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, run in rows:
        r = asyncio.run(run)
        line = (
            f"| {name} | {r['status']:.0f} | {r['cpu_stall_ms']:.1f} | {r['wall_stall_ms']:.1f} "
            f"| {r['loop_cpu_ms']:.1f} | {r['wall_ms']:.0f} |"
        )
        print(line, flush=True)
        lines.append(line)
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
