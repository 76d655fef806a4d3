"""`llm-gate demo`: the whole stack on loopback, a scripted set of requests, a table.

`llm-gate demo --keep` leaves it running on fixed ports for you to curl; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .stack import Stack

CHAT = "/v1/chat/completions"
DEMO_CONFIG: dict[str, Any] = {
    "identity": {
        "api_keys": {
            "sk-demo-vip": {"tenant": "acme", "tier": "vip"},
            "sk-demo-standard": {"tenant": "beta", "tier": "standard"},
        }
    },
    "validation": {"required_headers": [{"header": "x-business-scene", "path_prefix": "/v1/completions"}]},
}
VIP = {"authorization": "Bearer sk-demo-vip"}


def chat(content: str, model: str = "llama-3-8b", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


@dataclass
class Step:
    title: str
    path: str = CHAT
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


SCRIPT = [
    Step("chat, VIP key", json=chat("What is the capital of France?"), headers=VIP),
    Step("streamed chat (SSE)", json=chat("Tell me a story", stream=True), headers=VIP),
    Step("model phi-3 → fallback pool", json=chat("Summarise this", model="phi-3")),
    Step("spoofed x-gate-cluster", json=chat("Route me"), headers={"x-gate-cluster": "fallback"}),
    Step(
        "completions with scene",
        path="/v1/completions",
        json={"model": "llama-3-8b", "prompt": "Hi"},
        headers={"x-business-scene": "support"},
    ),
    Step("passthrough GET /v1/models", path="/v1/models", method="GET"),
    Step("wrong content type", content=b"{}", headers={"content-type": "text/plain"}),
    Step("broken JSON", content=b'{"model": ', headers={"content-type": "application/json"}),
    Step("bad field", json=chat("x", temperature=9)),
    Step("missing required header", path="/v1/completions", json={"model": "llama-3-8b", "prompt": "Hi"}),
    Step("prompt over the token limit", json=chat("word " * 17_000)),
    Step("body over 1 MiB", json=chat("x" * 1_100_000)),
]


def run_step(client: httpx.Client, step: Step) -> list[str]:
    started = time.perf_counter()
    if step.method == "GET":
        r = client.get(step.path, headers=step.headers)
        text = r.text
    else:
        r = client.post(step.path, json=step.json, content=step.content, headers=step.headers)
        text = r.text
    ms = (time.perf_counter() - started) * 1000
    return [
        step.title,
        str(r.status_code),
        r.headers.get("x-gate-cluster", "-"),
        f"{ms:.0f}",
        summarise(text),
    ]


def summarise(text: str) -> str:
    import orjson

    if text.startswith("data: "):
        frames = [f for f in text.split("\n\n") if f.startswith("data: ")]
        return f"{len(frames)} SSE frames, last {frames[-1]!r}"
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:60]
    if "error" in doc:
        return "error: " + str(doc["error"]["message"])[:70]
    if "choices" in doc:
        choice = doc["choices"][0]
        answer = choice.get("message", {}).get("content") or choice.get("text", "")
        return f"{doc['model']}: {answer[:50]}"
    return text[:60]


def print_table(rows: list[list[str]]) -> None:
    head = ["request", "status", "x-gate-cluster", "ms", "answer"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)) + "  " + head[4]
    print(line)
    print("-" * min(len(line) + 40, 140))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])


def keep_running(stack: Stack) -> None:
    print(f"\nThe stack runs on loopback. Envoy: {stack.url}   (Ctrl-C stops everything)\n")
    print(
        f"  curl -s {stack.url}{CHAT} -H 'content-type: application/json' \\\n"
        "       -H 'authorization: Bearer sk-demo-vip' \\"
    )
    print('       -d \'{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}\' -i')
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
    stack = Stack(gate_config=DEMO_CONFIG, with_redis=shutil.which("redis-server") is not None)
    if args.keep:
        stack.envoy_port, stack.admin_port = args.port, 9901
        stack.pool_ports = {"primary": 8001, "fallback": 8002}
        stack.gate_ports, stack.metrics_ports = [50051], [9464]
    print("starting simulators (primary, fallback), the gate and Envoy on 127.0.0.1 ...", flush=True)
    with stack:
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            rows = [run_step(client, step) for step in SCRIPT]
        print()
        print_table(rows)
        if args.keep:
            keep_running(stack)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
