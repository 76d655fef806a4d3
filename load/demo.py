"""`llm-gate demo`: the whole stack on loopback, scripted requests, a table per feature.

Simulated vLLM pools (primary, fallback), Redis (when `redis-server` is installed), two
gate processes and a real Envoy, all on 127.0.0.1. `llm-gate demo --keep` leaves the
stack running on fixed ports for you to curl; Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .stack import Stack

CHAT = "/v1/chat/completions"
VIP = {"authorization": "Bearer sk-demo-vip"}
STANDARD = {"authorization": "Bearer sk-demo-standard"}
DEMO_CONFIG: dict[str, Any] = {
    "identity": {
        "api_keys": {
            "sk-demo-vip": {"tenant": "acme", "tier": "vip"},
            "sk-demo-standard": {"tenant": "beta", "tier": "standard"},
        }
    },
    "validation": {"required_headers": [{"header": "x-business-scene", "path_prefix": "/v1/completions"}]},
    "ratelimit": {"tiers": {"standard": {"tenant": {"rate": 1, "burst": 5}}}},
    # The shipped calibration turns the semantic layer on for English with e5-small only (its
    # precision's 95% lower bound reached 0.95; README table); the default embedder is MiniLM.
    "cache": {"semantic": {"embedder": "e5-small"}},
    # Short breaker windows so the switch and the return fit in a demo.
    "breaker": {
        "window_s": 4,
        "min_samples": 4,
        "open_p95_s": 0.8,
        "close_p95_s": 0.5,
        "hold_s": 2,
        "recovery_s": 2,
        "probe_share": 0.2,
        "probe_interval_s": 0.5,
        "probe_min_samples": 2,
        "sync_interval_s": 0.25,
    },
}


def chat(content: str, model: str = "llama-3-8b", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


@dataclass
class Step:
    title: str
    json: Any = None
    path: str = CHAT
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(VIP))
    method: str = "POST"


REQUESTS = [
    Step("chat, VIP key", chat("What is the capital of France?")),
    Step("streamed chat (SSE)", chat("Tell me a story", stream=True)),
    Step("model phi-3 → fallback pool", chat("Summarise this", model="phi-3")),
    Step("spoofed x-gate-cluster", chat("Route me"), headers={**VIP, "x-gate-cluster": "fallback"}),
    Step(
        "completions with scene",
        {"model": "llama-3-8b", "prompt": "Hi"},
        "/v1/completions",
        headers={**VIP, "x-business-scene": "support"},
    ),
    Step("passthrough GET /v1/models", path="/v1/models", method="GET"),
    Step("around the gate: /v1/embeddings", {"model": "llama-3-8b", "input": "hi"}, "/v1/embeddings"),
    Step("escaped slash: /v1/chat%2F…", chat("Sneak past"), "/v1/chat%2Fcompletions"),
    Step("wrong content type", content=b"{}", headers={"content-type": "text/plain"}),
    Step("broken JSON", content=b'{"model": ', headers={"content-type": "application/json"}),
    Step("bad field", chat("x", temperature=9)),
    Step("missing required header", {"model": "llama-3-8b", "prompt": "Hi"}, "/v1/completions"),
    Step("prompt over the token limit", chat("word " * 17_000)),
    Step("body over 1 MiB", chat("x" * 1_100_000)),
    Step(
        "unknown key → anonymous caller",
        chat("Who am I?"),
        headers={"authorization": "Bearer sk-nope", "x-priority": "vip"},
    ),
]
CACHE = [
    Step("first ask → the model", chat("How do I reset my password?")),
    Step("same question again", chat("How do I reset my password?")),
    Step("same, other case/spacing", chat("how do I  reset my PASSWORD?")),
    Step("near-exact: a polite word", chat("How do I reset my password please?")),
    Step("paraphrase", chat("What is the way to reset my password?")),
    Step("should miss: other verb", chat("How do I change my password?")),
    Step("should miss: negation", chat("Why can't I reset my password?")),
    Step("cached answer, streamed", chat("How do I reset my password?", stream=True)),
    Step(
        "cache-control: no-cache",
        chat("How do I reset my password?"),
        headers={**VIP, "cache-control": "no-cache"},
    ),
]
COLUMNS = ["request", "status", "cluster", "cache", "sim.", "ms", "answer"]


def run_step(client: httpx.Client, step: Step) -> list[str]:
    started = time.perf_counter()
    if step.method == "GET":
        r = client.get(step.path, headers=step.headers)
    else:
        r = client.post(step.path, json=step.json, content=step.content, headers=step.headers)
    ms = (time.perf_counter() - started) * 1000
    h = r.headers
    similarity = f" {float(h['x-gate-similarity']):.2f}" if "x-gate-similarity" in h else ""
    cache = h.get("x-gate-cache", "-") + (f" {h['x-gate-cache-match']}" if "x-gate-cache-match" in h else "")
    return [
        step.title,
        str(r.status_code),
        h.get("x-gate-cluster", "-"),
        cache + similarity,
        "",
        f"{ms:.0f}",
        f"redirect to {r.headers['location']}" if r.is_redirect else summarise(r.text),
    ]


def summarise(text: str) -> str:
    if text.startswith("data: "):
        frames = [f for f in text.split("\n\n") if f.startswith("data: ")]
        return f"{len(frames)} SSE frames, last {frames[-1]!r}"
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:60]
    if "error" in doc:
        return "error: " + str(doc["error"]["message"])[:72]
    if "choices" in doc:
        choice = doc["choices"][0]
        answer = (choice.get("message") or {}).get("content") or choice.get("text", "")
        return f"{answer[:56]}"
    return text[:60]


def table(title: str, rows: list[list[str]], columns: list[str] = COLUMNS) -> None:
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns) - 1)]
    print(f"\n== {title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=False)) + "  " + columns[-1])
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + str(row[-1]))


def served(stack: Stack, pool: str = "primary") -> int:
    return int(httpx.get(stack.sim_url(pool) + "/admin/state").json()["served"])


def scripted(stack: Stack, client: httpx.Client, title: str, steps: list[Step]) -> None:
    rows = []
    for step in steps:
        before = served(stack) + served(stack, "fallback")
        row = run_step(client, step)
        row[4] = str(served(stack) + served(stack, "fallback") - before)  # model calls it cost
        rows.append(row)
    table(title + "   (sim. = calls that reached a model server)", rows)


def coalescing(stack: Stack) -> None:
    question = chat("Summarise our refund policy in one line", max_tokens=16)

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=stack.url, timeout=30, limits=limits) as c:
            return await asyncio.gather(*(c.post(CHAT, json=question, headers=VIP) for _ in range(40)))

    before = served(stack)
    results = asyncio.run(burst())
    kinds = Counter(r.headers.get("x-gate-cache", str(r.status_code)) for r in results)
    answers = {r.json()["choices"][0]["message"]["content"] for r in results if r.status_code == 200}
    print("\n== 40 identical requests at once (two gate processes, one Redis lease)")
    print(
        f"   model calls: {served(stack) - before}   answers: {dict(kinds)}   "
        f"distinct answers: {len(answers)}"
    )


def rate_limit(client: httpx.Client) -> None:
    rows = []
    for i in range(7):
        r = client.post(CHAT, json=chat(f"standard question {i}"), headers=STANDARD)
        h = r.headers
        rows.append(
            [
                f"standard key #{i + 1}",
                str(r.status_code),
                h.get("x-ratelimit-limit-requests", "-"),
                h.get("x-ratelimit-remaining-requests", "-"),
                h.get("retry-after", "-"),
                summarise(r.text) if r.status_code != 200 else "ok",
            ]
        )
    table(
        "Rate limit: tier standard, tenant bucket burst 5, 1 request/s",
        rows,
        ["request", "status", "limit", "remaining", "retry-after", "answer"],
    )


def breaker(stack: Stack) -> None:
    results: list[tuple[float, int, str]] = []
    stop = threading.Event()

    def load(index: int) -> None:
        with httpx.Client(base_url=stack.url, timeout=30) as c:
            n = 0
            while not stop.is_set():
                n += 1
                r = c.post(CHAT, json=chat(f"client {index} question {n}", max_tokens=4), headers=VIP)
                results.append((time.monotonic(), r.status_code, r.headers.get("x-gate-cluster", "-")))

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    faults = stack.sim_url("primary") + "/admin/faults"
    marks = [("steady load", time.monotonic())]
    time.sleep(2)
    marks.append(("primary slowed by 1.5 s", time.monotonic()))
    httpx.post(faults, json={"extra_latency_ms": 1500})
    wait_state(stack, 2, 15)
    marks.append(("breaker open", time.monotonic()))
    time.sleep(2)
    httpx.post(faults, json={"extra_latency_ms": 0})
    marks.append(("primary restored", time.monotonic()))
    wait_state(stack, 0, 20)
    marks.append(("breaker closed again", time.monotonic()))
    time.sleep(2)
    marks.append(("end", time.monotonic()))
    stop.set()
    for t in threads:
        t.join(30)
    rows = []
    for (name, start), (_, end) in itertools.pairwise(marks):
        window = [r for r in results if start <= r[0] < end]
        clusters = Counter(r[2] for r in window)
        errors = sum(1 for r in window if r[1] != 200)
        rows.append(
            [name, f"{end - start:.1f}", str(clusters["primary"]), str(clusters["fallback"]), str(errors)]
        )
    table(
        "Latency breaker: P95 over 0.8 s → fallback (phi-3-mini) until probes are fast again",
        rows,
        ["phase", "s", "→ primary", "→ fallback", "errors"],
    )


def wait_state(stack: Stack, state: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics").text
        if f'gate_breaker_state{{pool="primary"}} {float(state)}' in text:
            return
        time.sleep(0.1)


def saved(stack: Stack) -> None:
    total = 0.0
    for port in stack.metrics_ports:
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
            if line.startswith("gate_cache_requests_total{") and ('"hit"' in line or '"coalesced"' in line):
                total += float(line.split()[-1])
    print(f"\nGPU calls saved by the cache and coalescing in this demo: {total:.0f}")


def keep_running(stack: Stack) -> None:
    print(f"\nThe stack runs on loopback. Envoy: {stack.url}   (Ctrl-C stops everything)\n")
    print(f"  curl -si {stack.url}{CHAT} -H 'content-type: application/json' \\")
    print("       -H 'authorization: Bearer sk-demo-vip' \\")
    print('       -d \'{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}\'')
    print(
        f"  gate metrics: http://127.0.0.1:{stack.metrics_ports[0]}/metrics   "
        f"simulators: {stack.sim_url('primary')}/admin/state {stack.sim_url('fallback')}/admin/state"
    )
    print(f"  logs: {stack.workdir}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(p.poll() is None for p in stack.procs.values()):
            time.sleep(0.5)
        print("a process of the stack exited; stopping", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nstopping")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the stack running on fixed ports")
    parser.add_argument("--port", type=int, default=10000, help="Envoy's port with --keep")
    args = parser.parse_args(argv)
    with_redis = shutil.which("redis-server") is not None
    stack = Stack(
        gate_config=DEMO_CONFIG, gate_workers=2, with_redis=with_redis, sim_args=["--itl-ms", "10"],
        keep_workdir=True,
    )
    if args.keep:
        stack.envoy_port, stack.admin_port = args.port, 9901
        stack.pool_ports = {"primary": 8001, "fallback": 8002}
        stack.gate_ports, stack.metrics_ports = [50051, 50052], [9464, 9465]
    print(
        "starting simulated pools (primary: llama-3-8b, fallback: phi-3-mini), "
        f"{'Redis, ' if with_redis else ''}two gate processes and Envoy on 127.0.0.1 ...",
        flush=True,
    )
    with stack, httpx.Client(base_url=stack.url, timeout=30) as client:
        scripted(stack, client, "Requests: routing, streaming, every kind of bad input", REQUESTS)
        scripted(stack, client, "Answer cache", CACHE)
        coalescing(stack)
        rate_limit(client)
        breaker(stack)
        saved(stack)
        if args.keep:
            keep_running(stack)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
