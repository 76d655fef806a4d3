"""The gate's own Python work per request, without gRPC, Envoy or wrk: CPU µs per path.

Feeds a gate `Session` the messages Envoy sends for one request (request headers, body,
response headers, and the response body when the gate asks for it) and times many requests
in a row with the process's CPU clock. It isolates the per-request work `bench_gate`'s
ratios depend on, so a change can be measured in seconds even on a busy machine; the ratios
to the no-op ext_proc still come from `bench_gate`.

    python -m load.bench_hop [--requests 400] [--repeat 12]   (writes load/results/bench_hop.md)
    python -m load.bench_hop --semantic minilm [--requests 400]   (a semantic miss's time, by part)
    python -m load.bench_hop --redis   (the same paths on a Redis store, started here: the request
                                        path's client against plain redis-py, alternated)
    python -m load.bench_hop --miss-wait   (on a Redis store: how long a miss's last message and
                                            the whole miss take, wall clock, p50)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import orjson
import redis.asyncio as aioredis
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc import redis_client, redis_wire
from extproc.access import batch_access_lines
from extproc.app import build_pipeline
from extproc.config import Config
from extproc.metrics import Metrics
from extproc.server import Session

from .bench_gate import ANSWER, ONLY_VALIDATE_AND_ROUTE, SEMANTIC_OFF, semantic
from .stack import RedisServer

RESULTS = Path(__file__).parent / "results" / "bench_hop.md"
ROUND_TRIP_S = 0.002  # one request at a time: the client's round trip before its next one

# What Envoy sends for wrk's POST (Envoy adds x-request-id, x-forwarded-proto, x-envoy-*).
REQUEST_HEADERS = {
    ":authority": "127.0.0.1:10000",
    ":path": "/v1/chat/completions",
    ":method": "POST",
    ":scheme": "http",
    "content-type": "application/json",
    "content-length": "96",
    "x-forwarded-proto": "http",
    "x-request-id": "3f1e9a52-7d0c-4c1e-9d55-2a8f5f0b7c11",
}
RESPONSE_HEADERS = {
    ":status": "200",
    "content-type": "application/json",
    "content-length": str(len(ANSWER)),
    "date": "Tue, 01 Dec 2026 07:00:00 GMT",
    "server": "envoy",
    "x-envoy-upstream-service-time": "0",
}


def headers_message(phase: str, values: dict[str, str]) -> pb.ProcessingRequest:
    hv = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    return pb.ProcessingRequest(**{phase: pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hv))})


def body_message(phase: str, data: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(**{phase: pb.HttpBody(body=data, end_of_stream=True)})


def chat(question: str) -> bytes:
    return orjson.dumps(
        {"model": "llama-3-8b", "max_tokens": 16, "messages": [{"role": "user", "content": question}]}
    )


REQUEST = headers_message("request_headers", REQUEST_HEADERS)
# The same from a client address (Envoy appends its peer): what a per-IP rate limit counts.
REQUEST_FROM = headers_message("request_headers", {**REQUEST_HEADERS, "x-forwarded-for": "10.0.0.7"})
RESPONSE = headers_message("response_headers", RESPONSE_HEADERS)
RESPONSE_BODY = body_message("response_body", ANSWER.encode())


async def one_request(
    session: Session, body: pb.ProcessingRequest, request: pb.ProcessingRequest = REQUEST
) -> None:
    """Envoy's messages in order, each sent only when the gate's answers ask for it. The loop
    turns between them, as a server's does while the next message is on its way: what a
    message's handling left to the loop (timers, a store's tasks) is counted with the request."""
    body_wanted = False
    for message in (request, body, RESPONSE):
        answers = await session.handle(message)
        await asyncio.sleep(0)
        last = answers[-1]
        if last.WhichOneof("response") == "immediate_response":
            break
        mode = last.mode_override
        body_wanted = last.HasField("mode_override") and mode.response_body_mode != mode.NONE
    else:
        if body_wanted:
            await session.handle(RESPONSE_BODY)
    await session.close()
    await asyncio.sleep(0)


async def measure(
    config: dict[str, Any], questions: Callable[[int], str], requests: int, repeat: int,
    request: pb.ProcessingRequest = REQUEST,
) -> float:
    """CPU µs per request, the best of `repeat` runs (it filters out time lent elsewhere)."""
    pipeline = build_pipeline(Config.model_validate(config), Metrics())
    await pipeline.start()
    try:
        for i in range(200):  # warm up: imports, caches, the first store entry
            await one_request(Session(pipeline), body_message("request_body", chat(questions(i))), request)
        best = float("inf")
        for r in range(repeat):
            first = r * requests + 1000
            bodies = [body_message("request_body", chat(questions(first + i))) for i in range(requests)]
            started = time.process_time()
            for b in bodies:
                await one_request(Session(pipeline), b, request)
            best = min(best, (time.process_time() - started) / requests * 1e6)
        return best
    finally:
        await pipeline.aclose()


VARIANTS: list[tuple[str, dict[str, Any], Callable[[int], str]]] = [
    ("identity, validation, routing", ONLY_VALIDATE_AND_ROUTE, lambda i: f"question {i}"),
    ("every stage, cache misses, semantic off", SEMANTIC_OFF, lambda i: f"question {i}"),
    ("every stage, cache hits", SEMANTIC_OFF, lambda i: "What is 2+2?"),
]


async def semantic_breakdown(embedder: str, requests: int) -> str:
    """Where a semantic miss's own time goes, one request at a time (a client's round trip
    apart, as at one connection: the work after an answer is not in the next request's way),
    from the gate's metrics:
    the text's wait for the embedding thread, the model run, the rest of the cache stage (the
    lookup beyond the embedding, the hand-back) and everything else (other stages, capture)."""
    metrics = Metrics()
    pipeline = build_pipeline(Config.model_validate(semantic(embedder)), metrics)
    await pipeline.start()
    series = (metrics.own_latency.labels(), metrics.stage_seconds.labels("cache", "request"),
              metrics.embed_queue_seconds.labels(), metrics.embed_seconds.labels())
    try:
        for i in range(200):
            await one_request(Session(pipeline), body_message("request_body", chat(f"question {i} of 7")))
            await asyncio.sleep(ROUND_TRIP_S)
        before = [s.read()[1] for s in series]
        for i in range(requests):
            await one_request(Session(pipeline), body_message("request_body", chat(f"question {i} of 9")))
            await asyncio.sleep(ROUND_TRIP_S)
        spent = [(s.read()[1] - b) / requests * 1e3 for s, b in zip(series, before, strict=True)]
        own, cache, queued, model = spent
    finally:
        await pipeline.aclose()
    return (f"{embedder}: own {own:.2f} ms = model {model:.2f} + wait for the embedding thread "
            f"{queued:.2f} + rest of the cache stage {cache - model - queued:.2f} + other stages and "
            f"capture {own - cache:.2f}")


async def miss_wait(url: str, requests: int) -> str:
    """A miss on a Redis store, one at a time with a client's round trip between them: the p50
    wall time of its last message (the answer's body, where the answer is kept) and of all of
    its messages."""
    pipeline = build_pipeline(Config.model_validate({**SEMANTIC_OFF, "store": {"redis_url": url}}), Metrics())
    await pipeline.start()
    last, whole = [], []
    try:
        for i in range(requests + 100):
            session = Session(pipeline)
            started = time.perf_counter()
            for message in (REQUEST, body_message("request_body", chat(f"question {i}")), RESPONSE):
                await session.handle(message)
            before_last = time.perf_counter()
            await session.handle(RESPONSE_BODY)
            ended = time.perf_counter()
            await session.close()
            await asyncio.sleep(ROUND_TRIP_S)
            if i >= 100:  # after a warm-up
                last.append(ended - before_last)
                whole.append(ended - started)
    finally:
        await pipeline.aclose()
    return (f"a miss on Redis: its last message p50 {statistics.median(last) * 1e3:.3f} ms, "
            f"all of its messages p50 {statistics.median(whole) * 1e3:.3f} ms")


def redis_rows(requests: int, repeat: int, rounds: int = 3) -> list[str]:
    """Each path on a Redis store, with the request path's client (`redis_wire.FastRedis`) and
    with plain redis-py in its place, alternated `rounds` times; the best of each."""
    server = RedisServer().start()
    # a per-IP limit far above the load: every request makes its rate-limit call, as under limits
    # (the requests come from one client address)
    store = {"store": {"redis_url": server.url},
             "ratelimit": {"tiers": {"standard": {"ip": {"rate": 1e6, "burst": 1_000_000}}}}}
    import uvloop

    rows = []
    try:
        for name, config, questions in VARIANTS:
            if name.startswith("identity"):
                continue  # no store call
            best = {"wire": float("inf"), "redis-py": float("inf")}
            for _ in range(rounds):
                for client in best:
                    # the baseline: redis-py's own client where the request path's would be
                    fast = aioredis.Redis if client == "redis-py" else redis_wire.FastRedis
                    with patch.object(redis_client, "FastRedis", fast):
                        run = measure({**config, **store}, questions, requests, repeat, REQUEST_FROM)
                        us = uvloop.run(run)
                    best[client] = min(best[client], us)
                    print(f"{name:45s} {client:9s} {us:7.1f} µs CPU per request", flush=True)
            rows.append(f"| {name} | {best['redis-py']:.0f} | {best['wire']:.0f} |")
    finally:
        server.kill()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=12)
    parser.add_argument("--only", default="", help="run only variants whose name contains this")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--redis", action="store_true",
                        help="instead: the paths on a Redis store, our client against redis-py")
    parser.add_argument("--miss-wait", action="store_true",
                        help="instead: a miss's wall time on a Redis store, its last message and all")
    parser.add_argument("--semantic", metavar="EMBEDDER",
                        help="instead: where a semantic miss's own time goes (minilm or e5-small)")
    args = parser.parse_args(argv)
    # The access log on and batched, as a gate process writes it (`app.run_process`).
    logging.basicConfig(
        level=logging.INFO, filename=os.devnull, format="%(asctime)s gate[0] %(levelname)s %(message)s"
    )
    batch_access_lines(open(os.devnull, "w"), "gate[0] INFO")  # lives as long as the run
    import uvloop

    if args.semantic:
        print(uvloop.run(semantic_breakdown(args.semantic, args.requests)))
        return 0
    if args.miss_wait:
        server = RedisServer().start()
        try:
            print(uvloop.run(miss_wait(server.url, args.requests)))
        finally:
            server.kill()
        return 0
    if args.redis:
        out = args.out if args.out != RESULTS else RESULTS.with_name("bench_hop_redis.md")
        rows = redis_rows(args.requests, args.repeat)
        out.write_text(
            f"# The gate's own work per request on a Redis store ({time.strftime('%Y-%m-%d')})\n\n"
            f"`python -m load.bench_hop --redis --requests {args.requests} --repeat {args.repeat}`: as "
            "`bench_hop.md`, with the store in a redis-server started for the run (every store call "
            "a real round trip on loopback) and a per-IP rate limit far above the load; once with "
            "the request path's client (`extproc/redis_wire.py`) and once with plain redis-py in "
            "its place, alternated three times; the best of each.\n\n"
            "| path | redis-py: CPU µs per request | the request path's client |\n"
            "|---|---:|---:|\n" + "\n".join(rows) + "\n"
        )
        return 0
    rows = []
    for name, config, questions in VARIANTS:
        if args.only in name:
            us = uvloop.run(measure(config, questions, args.requests, args.repeat))
            print(f"{name:45s} {us:7.1f} µs CPU per request", flush=True)
            rows.append(f"| {name} | {us:.0f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        f"# The gate's own work per request ({time.strftime('%Y-%m-%d')})\n\n"
        f"`python -m load.bench_hop --requests {args.requests} --repeat {args.repeat}`: a Session fed "
        "Envoy's messages in process (no gRPC, Envoy or wrk), the loop turning between them as a "
        "server's does (what a request leaves to the loop is counted), access log on, in-process stores; "
        f"the best of {args.repeat} runs.\n\n| path | CPU µs per request |\n|---|---:|\n"
        + "\n".join(rows)
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
